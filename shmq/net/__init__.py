"""The only package that touches TCP sockets (and the only caller of ``os.sendfile``)."""
