"""Request handling: Kafka APIs as pure handlers over a narrow context (STYLE.md §2)."""
