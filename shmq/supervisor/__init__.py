"""The controller process: metadata, topic admin, producer ids, and the worker supervisor."""
