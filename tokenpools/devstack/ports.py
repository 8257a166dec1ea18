"""Free TCP ports for the services the project starts (kernel-picked; a small race remains until they are bound)."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports on ``host`` (``""`` probes all interfaces, for servers that bind them all)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:  # all held open at once, so the kernel cannot hand out one port twice
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]
