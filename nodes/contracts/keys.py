"""CURVE keys, and which sockets need them.

Every socket another user of this machine could reach is authenticated: any tcp:// address
(loopback included) and abstract ipc://@NAME sockets. Only an ipc:// socket file in a
directory that no one but this user can enter (the default: a fresh 0700 temporary directory)
goes without. Without `transport.keys_dir` the server makes a key pair for the run and hands
it to the workers it starts through their environment (readable by this user only), so
nobody else can join; workers started by hand need keygen's keys.

`python -m emulator keygen DIR` writes:

    DIR/server.key          the server's public key: every worker needs it
    DIR/server.key_secret   the server's key pair: stays with the server
    DIR/client.key          a worker public key ...
    DIR/client.key_secret   ... and its key pair: what a worker presents (--keys DIR)
    DIR/authorized/         public keys of the workers the server lets in (client.key)

DIR must be new (keygen creates it, mode 0700) or an empty directory of this user's that no one
else may write; its mode is never changed. Secret key files are written 0600. As OpenSSH does with
its keys, the server and the workers refuse a secret key file that others may read or write, or
that another user owns, and a keys directory or authorized/ (or a public key in it) that others
may write.

A worker on another machine needs a copy of DIR without server.key_secret. More workers
with their own key pairs: `zmq.auth.create_certificates(DIR, NAME)`, chmod 600 NAME.key_secret,
and copy NAME.key into DIR/authorized/.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

SERVER_PUBLIC = "server.key"
SERVER_SECRET = "server.key_secret"
CLIENT_PUBLIC = "client.key"
CLIENT_SECRET = "client.key_secret"
AUTHORIZED = "authorized"


class KeysError(ValueError):
    """keygen cannot write into its directory, or a key file holds no secret key."""


def keygen(directory: str | Path) -> list[Path]:
    """Write a server and a client key pair into `directory`: a new one (made 0700) or an empty
    one of this user's that no one else may write, whose mode is left as it is."""
    import zmq

    d = Path(directory).expanduser()
    if d.exists():
        if not d.is_dir():
            raise KeysError(f"{d} is not a directory")
        held = sorted(p.name for p in d.iterdir())
        if held:
            raise KeysError(
                f"{d} is not empty ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): keygen writes "
                "into a new or empty directory and never overwrites keys"
            )
        problem = unprotected(d, secret=False)
        if problem:
            raise KeysError(problem)
    else:
        d.mkdir(mode=0o700, parents=True)
    (d / AUTHORIZED).mkdir(mode=0o700)
    server, client = zmq.curve_keypair(), zmq.curve_keypair()
    files = [
        (SERVER_PUBLIC, server[0], None),
        (SERVER_SECRET, *server),
        (CLIENT_PUBLIC, client[0], None),
        (CLIENT_SECRET, *client),
        (f"{AUTHORIZED}/{CLIENT_PUBLIC}", client[0], None),
    ]
    for name, public, secret in files:
        _write_key(d / name, public, secret)
    return [d / name for name, _, _ in files]


def _write_key(path: Path, public: bytes, secret: bytes | None) -> None:
    """One key file in pyzmq's (czmq's) certificate format; a secret one is 0600 from its creation."""
    lines = ["metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600 if secret else 0o644)
    with open(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def unprotected(path: Path, secret: bool) -> str:
    """'' if only this user may change `path` (and, for a secret key file, read it); else why not,
    in one line. OpenSSH's rule: whoever can write a key can impersonate, whoever can read a secret
    key can too."""
    st = path.stat()
    if st.st_uid != os.getuid():
        return f"{path} is owned by uid {st.st_uid}: expected one of this user's (uid {os.getuid()})"
    mode = stat.S_IMODE(st.st_mode)
    if secret and mode & 0o077:
        return (
            f"UNPROTECTED PRIVATE KEY FILE: permissions {mode:04o} for {path} are too open: "
            f"expected 0600, readable by this user only (chmod 600 {path})"
        )
    if mode & 0o022:
        return (
            f"permissions {mode:04o} for {path} are too open: others could replace the keys; "
            f"expected no write for group and others (chmod go-w {path})"
        )
    return ""


# The server also starts local workers, so it needs their files too.
SERVER_NEEDS = (SERVER_PUBLIC, SERVER_SECRET, CLIENT_SECRET, AUTHORIZED)
WORKER_NEEDS = (SERVER_PUBLIC, CLIENT_SECRET)


def missing_keys(directory: str | Path, needs: tuple[str, ...]) -> list[str]:
    d = Path(directory).expanduser()
    return [n for n in needs if not (d / n).exists()]


def unprotected_keys(directory: str | Path, needs: tuple[str, ...]) -> str:
    """'' if others can neither read the secret keys in `needs` nor change any of them (nor the
    directory, nor authorized/ and the public keys the server reads from it); else the first
    one they can, in one line. Every file in `needs` exists (missing_keys)."""
    d = Path(directory).expanduser()
    paths = [d] + [d / n for n in needs]
    if AUTHORIZED in needs:
        paths += sorted((d / AUTHORIZED).glob("*.key"))  # what the server's authenticator loads
    for path in paths:
        problem = unprotected(path, secret=path.name.endswith("_secret"))
        if problem:
            return problem
    return ""


def load_worker_keys(directory: str | Path) -> tuple[bytes, bytes, bytes]:
    """(own public, own secret, server public) for a worker's socket."""
    import zmq.auth

    d = Path(directory).expanduser()
    public, secret = _key_pair(d / CLIENT_SECRET)
    server_public, _ = zmq.auth.load_certificate(d / SERVER_PUBLIC)
    return public, secret, server_public


def _key_pair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from one of keygen's secret-key files."""
    import zmq.auth

    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise KeysError(f"{path} holds no secret key")
    return public, secret


@dataclass(frozen=True)
class ServerKeys:
    public: bytes  # z85, as pyzmq's sockets take them
    secret: bytes
    worker: tuple[bytes, bytes]  # the (public, secret) key pair of the workers the server starts
    authorized: Path | None  # keygen's authorized/ directory; None: only `worker` gets in


def server_keys(address: str, keys_dir: str) -> ServerKeys | None:
    """keygen's keys when `keys_dir` is given; none for an ipc socket in a private directory;
    else a key pair made for this run, so that only the workers the server starts get in."""
    import zmq

    if keys_dir:
        d = Path(keys_dir).expanduser()
        public, secret = _key_pair(d / SERVER_SECRET)
        return ServerKeys(public, secret, _key_pair(d / CLIENT_SECRET), d / AUTHORIZED)
    if is_private_ipc(address):
        return None
    public, secret = zmq.curve_keypair()
    return ServerKeys(public, secret, zmq.curve_keypair(), None)


# How the server hands its workers their keys: an environment variable, like a process's
# memory readable by this user only (a command line is world-readable in /proc).
WORKER_KEYS_ENV = "DPFL_WORKER_KEYS"


def worker_keys_env(keys: ServerKeys) -> dict[str, str]:
    return {WORKER_KEYS_ENV: b" ".join([*keys.worker, keys.public]).decode()}


def worker_keys_from_env() -> tuple[bytes, bytes, bytes] | None:
    """(own public, own secret, server public), as load_worker_keys, or None."""
    value = os.environ.pop(WORKER_KEYS_ENV, "")
    if not value:
        return None
    own_public, own_secret, server_public = (k.encode() for k in value.split())
    return own_public, own_secret, server_public


def is_private_ipc(address: str) -> bool:
    """An ipc:// socket file in a directory of this user's that no one else may enter."""
    if not address.startswith("ipc://") or address.startswith("ipc://@"):  # @: abstract, no file at all
        return False
    try:
        d = Path(address[len("ipc://") :]).parent.stat()
    except OSError:
        return False
    return d.st_uid == os.getuid() and not d.st_mode & 0o077


def is_local_address(address: str) -> bool:
    """True for ipc:// and for tcp:// on a loopback host; a wildcard or any name but
    localhost is a network address (a hostname is not resolved: it may reach the LAN)."""
    if not address or address.startswith("ipc://"):
        return True
    host = host_of(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(address: str) -> str:
    """The host of tcp://HOST:PORT, brackets stripped from an IPv6 literal."""
    rest = address.split("://", 1)[-1]
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def parse_tcp(address: str) -> tuple[str, int]:
    """(host, port) of tcp://HOST:PORT (an IPv6 host in brackets, PORT in 1..65535); ValueError if malformed."""
    host, sep, port = address[len("tcp://") :].rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    # an IPv6 host without brackets is ambiguous, and ZeroMQ takes an IPv6 literal only in them (is_ipv6)
    if not sep or not host or (":" in host) != bracketed or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(address)
    return host, int(port)


ADDRESS_FORMS = "tcp://HOST:PORT (PORT in 1..65535; an IPv6 HOST in brackets, tcp://[::1]:PORT) or ipc://PATH"


def address_problem(address: str) -> str:
    """'' if ZeroMQ can take `address` as written (a tcp port out of range it would silently wrap into
    another); else what was expected, in words. The one check of the server's, the CLI's and a worker's."""
    if address.startswith("tcp://"):
        try:
            parse_tcp(address)
        except ValueError:
            return f"expected {ADDRESS_FORMS}"
        return ""
    return "" if address.startswith("ipc://") and len(address) > len("ipc://") else f"expected {ADDRESS_FORMS}"


def is_ipv6(address: str) -> bool:
    """Whether a socket for `address` needs ZeroMQ's IPV6 option (off, it refuses an IPv6 literal; on,
    it renames an IPv4 endpoint to its IPv6-mapped form), on the server's end and on a worker's."""
    return address.startswith("tcp://[")


def reachable_from_here(address: str) -> str:
    """The address a worker on this machine connects to: a wildcard bind becomes loopback."""
    host = host_of(address)
    if address.startswith("tcp://") and host in ("*", "0.0.0.0", "::"):
        port = address.rsplit(":", 1)[1]
        return f"tcp://{'[::1]' if host == '::' else '127.0.0.1'}:{port}"
    return address


def exposure_problem(address: str, curve: bool, keys_dir: str, hands_out_keys: bool = False) -> str:
    """'' if a server may listen on `address`; else the one-line reason it may not.
    CURVE is on with `curve` or on any network address, and then needs keygen's keys, unless the
    server `hands_out_keys`: it starts every worker of the run elsewhere itself (transport.launcher=ray),
    handing each the run's own key pair, so no one else gets in."""
    if (curve or not (is_local_address(address) or hands_out_keys)) and not keys_dir:
        if curve:
            return "transport.keys_dir = '': transport.curve = true needs keys (python -m emulator keygen DIR)"
        return (
            f"transport.address = {address!r}: listening beyond this machine needs CURVE keys in "
            f"transport.keys_dir (python -m emulator keygen DIR), or use tcp://127.0.0.1:PORT"
        )
    if not keys_dir:
        return ""
    missing = missing_keys(keys_dir, SERVER_NEEDS)
    if missing:
        return (
            f"transport.keys_dir = {keys_dir!r}: expected a directory written by python -m emulator keygen "
            f"(missing {', '.join(missing)})"
        )
    problem = unprotected_keys(keys_dir, SERVER_NEEDS)
    return f"transport.keys_dir = {keys_dir!r}: {problem}" if problem else ""
