"""What a new server is told at first boot: SSH public keys and the customer's cloud-init user data.

Core validates both when an order or a reinstall arrives (:func:`parse_ssh_public_key`,
:func:`check_user_data`); a hypervisor backend that writes a cloud-init seed combines the customer's
user data with its own cloud-config through :func:`compose_user_data`, so the customer's part can
add to the first boot but never drop the root keys, the password or the hostname vpsshop sets.
Network configuration travels in the seed's separate ``network-config`` file, which user data does
not touch.

All three are public (``from vpsshop import compose_user_data``) for backend plugins.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import yaml
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

MIN_RSA_BITS = 2048
MAX_PUBLIC_KEY_CHARS = 8192
"""An RSA key of 16384 bits is about 2,800 characters; anything longer is not a key."""
MAX_USER_DATA_BYTES = 16384
"""User data is capped at 16 KiB (EC2's limit; enough for a cloud-config or a script)."""
MAX_EXPANDED_CHARS = 65536
"""A cloud-config may use YAML anchors and aliases, but written out (as the seed's user-data is) it
may hold at most this many characters of keys and values: a few aliases of aliases (an "alias
bomb") would otherwise turn 500 bytes into gigabytes."""
MAX_DEPTH = 64
"""Mappings and lists nested deeper than this are refused (cloud-configs are a few levels deep). The
YAML scanner stops at this depth (:class:`_BoundedLoader`): PyYAML's cost per token grows with the
depth of open flow collections, so ``[[[[...`` 8,000 deep used to take seconds of CPU to refuse."""
MAX_INT_DIGITS = 4300
"""Integers of more digits are refused: Python cannot write them out (``sys.get_int_max_str_digits``),
so the seed's user-data could not be made."""

_KEY_TYPES = {
    "ssh-ed25519": "ed25519",
    "ecdsa-sha2-nistp256": "ecdsa",
    "ecdsa-sha2-nistp384": "ecdsa",
    "ecdsa-sha2-nistp521": "ecdsa",
    "ssh-rsa": "rsa",
}
_LINE = re.compile(r"^([a-z0-9-]+) ([A-Za-z0-9+/]+={0,2})(?: [\x20-\x7e]*)?$")

PROTECTED_KEYS = ("hostname", "fqdn", "preserve_hostname", "disable_root", "ssh_pwauth", "chpasswd", "password")
"""cloud-config keys whose value vpsshop sets: the customer's value is replaced by vpsshop's."""
COMBINED_KEYS = ("ssh_authorized_keys", "write_files", "runcmd", "bootcmd")
"""cloud-config lists that hold both: the customer's entries first, then vpsshop's."""


class InvalidInput(ValueError):
    """A public key or user data that vpsshop does not accept; the message says why."""


def _too_deep() -> InvalidInput:
    return InvalidInput(f"the cloud-config nests lists or mappings more than {MAX_DEPTH} levels deep")


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses, while scanning, a document nesting more than :data:`MAX_DEPTH`
    collections (flow ``[``/``{`` and block mappings and lists alike), and integers of more than
    :data:`MAX_INT_DIGITS` digits. The scanner counts what is open when a collection starts, so the
    refusal comes after at most :data:`MAX_DEPTH` levels of work whatever the document's depth."""

    def fetch_flow_collection_start(self, TokenClass: Any) -> None:
        if self.flow_level + len(self.indents) >= MAX_DEPTH:
            raise _too_deep()
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        added = super().add_indent(column)
        if added and len(self.indents) + self.flow_level > MAX_DEPTH:
            raise _too_deep()
        return added

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # decimal: int() refuses more than 4,300 digits
            value = None
        if value is None or abs(value) >= _INT_LIMIT:  # 0x..., 0b..., 1:2:3... past it too
            raise InvalidInput(f"a number in the cloud-config has more than {MAX_INT_DIGITS} digits")
        return value


_INT_LIMIT = 10**MAX_INT_DIGITS
_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


@dataclass(frozen=True)
class SshPublicKey:
    """A validated OpenSSH public key."""

    key_type: str
    """``ed25519``, ``ecdsa`` or ``rsa``."""
    bits: int
    openssh: str
    """``<algorithm> <base64>``, without the comment: the line written to ``authorized_keys``."""
    fingerprint: str
    """``SHA256:<base64 of the SHA-256 of the key blob, no padding>``, as ``ssh-keygen -l`` prints it."""


def parse_ssh_public_key(text: str) -> SshPublicKey:
    """Validate one line in OpenSSH ``authorized_keys`` format (``ssh-ed25519 AAAA... comment``).

    Accepted: Ed25519, ECDSA (NIST P-256, P-384, P-521) and RSA of at least 2048 bits.

    :raises InvalidInput: anything else (DSA, security-key types, short RSA, options, several lines).
    """
    line = text.strip()
    if not line or len(line) > MAX_PUBLIC_KEY_CHARS:
        raise InvalidInput(f"a public key is one line of at most {MAX_PUBLIC_KEY_CHARS} characters")
    match = _LINE.match(line)
    if match is None:
        raise InvalidInput(
            "not an OpenSSH public key line: expected '<type> <base64> [comment]' on one line, without options"
        )
    algorithm, b64 = match.group(1), match.group(2)
    kind = _KEY_TYPES.get(algorithm)
    if kind is None:
        raise InvalidInput(
            f"key type {algorithm!r} is not accepted; use ssh-ed25519, ecdsa-sha2-nistp256/384/521 "
            f"or ssh-rsa of at least {MIN_RSA_BITS} bits"
        )
    try:
        blob = base64.b64decode(b64, validate=True)
        key = load_ssh_public_key(f"{algorithm} {b64}".encode())
    except (ValueError, TypeError, binascii.Error):
        raise InvalidInput(f"the {algorithm} key data does not decode to a valid public key") from None
    if isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < MIN_RSA_BITS:
            raise InvalidInput(f"this RSA key has {bits} bits; at least {MIN_RSA_BITS} are required")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        bits = key.curve.key_size
    elif isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    else:  # pragma: no cover - the type table above admits nothing else
        raise InvalidInput(f"key type {algorithm!r} is not accepted")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return SshPublicKey(kind, bits, f"{algorithm} {b64}", f"SHA256:{digest}")


def check_user_data(text: str) -> str:
    """Validate user data: ``#cloud-config`` followed by a YAML mapping, or a script (``#!``).

    :return: ``"cloud-config"`` or ``"script"``.
    :raises InvalidInput: too large, not UTF-8 text, or neither form.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_USER_DATA_BYTES:
        raise InvalidInput(f"user data is {size} bytes; at most {MAX_USER_DATA_BYTES} are accepted")
    if "\x00" in text:
        raise InvalidInput("user data must be text (it contains a NUL character)")
    first = text.split("\n", 1)[0].strip()
    if first == "#cloud-config":
        _cloud_config(text)
        return "cloud-config"
    if text.startswith("#!"):
        return "script"
    raise InvalidInput("user data must start with '#cloud-config' (a YAML mapping follows) or '#!' (a script)")


def _cloud_config(text: str) -> dict[str, Any]:
    loader = None
    try:
        # Parsed once: the node graph first (aliases stay shared nodes: nothing is expanded yet), its
        # expansion checked, then the data built from it, as yaml.safe_load would.
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return {}
        _check_expansion(node)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidInput(f"the cloud-config is not valid YAML{where}") from None
    except RecursionError:
        raise _too_deep() from None
    except InvalidInput:
        raise
    except (ValueError, OverflowError):  # a value YAML resolves but Python cannot build (2001-13-45)
        raise InvalidInput("the cloud-config holds a value that is not valid (a date, time or number)") from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise InvalidInput("a cloud-config must be a YAML mapping (key: value lines)")
    _check_combined(data)
    try:  # what is accepted can be written into the seed (compose_user_data), or provisioning would fail
        json.dumps(data, default=str)
    except (TypeError, ValueError):
        raise InvalidInput("the cloud-config has a key that is not text or a number (a date, or binary)") from None
    return data


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document nested too deeply, one that contains itself through an alias, or one whose
    aliases expand it past :data:`MAX_EXPANDED_CHARS`. Each node is sized once (an alias is the
    same node object again), so this costs as little as the document's length."""
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    open_: set[int] = set()
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = len(node.value) + 1
            continue
        items = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else node.value
        if children_done:
            open_.discard(key)
            sizes[key] = 2 + sum(sizes[id(item)] + 1 for item in items)
            if sizes[key] > MAX_EXPANDED_CHARS:
                raise InvalidInput(
                    f"the cloud-config's YAML aliases expand it to more than {MAX_EXPANDED_CHARS} characters; "
                    "write the repeated parts out, or repeat less"
                )
            continue
        if key in open_:
            raise InvalidInput("the cloud-config contains itself through a YAML alias")
        if depth > MAX_DEPTH:
            raise InvalidInput(f"the cloud-config nests lists or mappings more than {MAX_DEPTH} levels deep")
        open_.add(key)
        stack.append((node, depth, True))
        for item in items:
            if id(item) in open_:
                raise InvalidInput("the cloud-config contains itself through a YAML alias")
            stack.append((item, depth + 1, False))


def _check_combined(data: dict[str, Any]) -> None:
    """The lists vpsshop extends must be lists (``ssh_authorized_keys`` may be one key as a string,
    as cloud-init takes it); anything else would be lost in the merge."""
    keys = data.get("ssh_authorized_keys")
    if keys is not None and not isinstance(keys, str | list):
        raise InvalidInput("ssh_authorized_keys must be a list of public keys (or one key as a string)")
    if isinstance(keys, list) and not all(isinstance(k, str) for k in keys):
        raise InvalidInput("each entry of ssh_authorized_keys must be a public key line (a string)")
    for key in COMBINED_KEYS:
        if key != "ssh_authorized_keys" and key in data and not isinstance(data[key], list):
            raise InvalidInput(f"{key} must be a YAML list")


def compose_user_data(base: dict[str, Any], user_data: str | None) -> str:
    """The ``user-data`` file of a seed: vpsshop's cloud-config ``base`` and the customer's part.

    * no customer part: ``#cloud-config`` and ``base`` (as JSON, which is YAML);
    * a cloud-config: one merged mapping. The keys in :data:`PROTECTED_KEYS` take vpsshop's value,
      the lists in :data:`COMBINED_KEYS` hold the customer's entries and then vpsshop's, every other
      key is the customer's;
    * a script: a MIME multi-part message, vpsshop's cloud-config first, then the script
      (``text/x-shellscript``, run once at the end of the first boot).
    """
    if user_data is None:
        return "#cloud-config\n" + json.dumps(base) + "\n"
    if check_user_data(user_data) == "cloud-config":
        merged = dict(_cloud_config(user_data))
        for key, value in base.items():
            theirs = merged.get(key)
            if key == "ssh_authorized_keys" and isinstance(theirs, str):
                theirs = [theirs]  # one key as a string: cloud-init reads it as a list of one
            if key in COMBINED_KEYS and isinstance(theirs, list) and isinstance(value, list):
                merged[key] = [*theirs, *value]
            else:
                merged[key] = value
        for key in PROTECTED_KEYS:
            if key not in base:
                merged.pop(key, None)
        return "#cloud-config\n" + json.dumps(merged, default=str) + "\n"
    message = MIMEMultipart()
    message.attach(MIMEText("#cloud-config\n" + json.dumps(base) + "\n", "cloud-config", "utf-8"))
    message.attach(MIMEText(user_data, "x-shellscript", "utf-8"))
    return message.as_string()
