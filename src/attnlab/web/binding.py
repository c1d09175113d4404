"""Where the explorer listens, and the Host names it answers to.

* ``check_bindable(host, port)``: the address is this machine's and the port free, checked by binding a
  socket to each address ``host`` names (as the server will) and closing it, before the model is loaded:
  a port in use, an address of another machine, a name that resolves to nothing, a port that needs
  privileges are each one line, not the server's start-up failure;
* ``allowed_hosts(host)``: the Host header names the explorer answers on whatever address it binds
  (``HostGuard`` in web/limits.py refuses the rest, and a browser's Origin that is not the Host): the
  loopback names, the bound address itself (``127.0.0.2``), and beyond loopback this machine's name and
  addresses. A page elsewhere cannot drive the explorer through a user's browser on any address: its own
  domain, pointed at this machine (DNS rebinding), is not among them;
* ``host_warning(host)``: the line printed when the explorer is reachable from other machines.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import socket

from attnlab.core.errors import ConfigError

LOOPBACK_NAMES = {"127.0.0.1", "localhost", "[::1]"}


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_warning(host: str) -> str | None:
    """A warning line when the explorer would be reachable from other machines."""
    if is_loopback(host):
        return None
    return (f"warning: binding {host}: the explorer (and the model it serves) is reachable from other "
            "machines on this network; it has no authentication. Use the default 127.0.0.1 to keep it local.")


def host_name(address: str) -> str:
    """An address as a Host header names it: lower case, an IPv6 address in brackets ('::1' -> '[::1]')."""
    address = address.lower()
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def machine_addresses() -> set[str]:
    """This machine's name and the addresses it resolves to (from /etc/hosts or the resolver; none when it does not
    resolve)."""
    name = socket.gethostname()
    found = {name.lower()}
    with contextlib.suppress(OSError):
        found |= {host_name(info[4][0].split("%")[0]) for info in socket.getaddrinfo(name, None)}
    return found


def allowed_hosts(host: str) -> set[str]:
    """The Host header names the explorer bound to ``host`` answers to: ``LOOPBACK_NAMES``, ``host`` itself, and
    when ``host`` is beyond loopback (``0.0.0.0``, a network address) this machine's name and addresses."""
    names = set(LOOPBACK_NAMES) | ({host_name(host)} if host.strip() else set())
    if not is_loopback(host):
        names |= machine_addresses()
    return names


def check_bindable(host: str, port: int) -> None:
    """ConfigError in one line unless the explorer can listen on ``host``, ``port`` now: every address ``host``
    resolves to is bound (with SO_REUSEADDR, as the server binds) and released."""
    if not host.strip():
        raise ConfigError("--host is empty (an unset shell variable?); use 127.0.0.1, or 0.0.0.0 for every address")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise ConfigError(f"--host {host[:100]} is not an address of this machine (nor a name that resolves); use "
                          "127.0.0.1, or one of this machine's addresses") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                raise ConfigError(_refusal(e, host, port)) from None


def _refusal(err: OSError, host: str, port: int) -> str:
    """The line for a bind that failed."""
    if err.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use; pick another with --port"
    if err.errno == errno.EADDRNOTAVAIL:
        return f"--host {host} is not an address of this machine; use 127.0.0.1, or one of this machine's addresses"
    if err.errno in (errno.EACCES, errno.EPERM):
        return f"port {port} needs privileges on this machine; pick one from 1024 up with --port"
    return f"cannot listen on {host} port {port} ({err.strerror}); pick another --host or --port"
