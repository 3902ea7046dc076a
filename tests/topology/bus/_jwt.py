"""A NATS operator, account and user made here (nkeys + hand-signed JWTs), for testing creds-file auth.

`decentralized(tmp)` returns the server configuration lines of an operator-mode nats-server (memory resolver,
JetStream enabled for the account) and the path of a user's ``.creds`` file. Nothing here is a mock: the server
checks the JWT chain and the nonce signature made with the user's seed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _keypair(prefix: int) -> Any:
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def _jwt(issuer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {
        "iat": int(time.time()),
        "iss": issuer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
    }
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode()
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = _b64(issuer.sign(f"{header}.{body}".encode()))
    return f"{header}.{body}.{signature}"


def decentralized(folder: Path) -> tuple[list[str], Path]:
    """(server configuration lines, user creds file) of a fresh operator → account → user chain."""
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)  # the server's own account (JetStream needs one)
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    operator_jwt = _jwt(operator, operator.public_key.decode(), "op", {"type": "operator"})
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True}
    jetstream = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account_jwt = _jwt(
        operator,
        account.public_key.decode(),
        "acc",
        {"type": "account", "limits": {**unlimited, "conn": -1, "leaf": -1, **jetstream}},
    )
    system_jwt = _jwt(operator, system.public_key.decode(), "sys", {"type": "account", "limits": unlimited})
    user_jwt = _jwt(account, user.public_key.decode(), "usr", {"type": "user", "subs": -1, "data": -1, "payload": -1})
    creds = folder / "user.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    creds.chmod(0o600)
    config = [
        f"operator: {operator_jwt}",
        f"system_account: {system.public_key.decode()}",
        "resolver: MEMORY",
        "resolver_preload: {",
        f"  {account.public_key.decode()}: {account_jwt}",
        f"  {system.public_key.decode()}: {system_jwt}",
        "}",
    ]
    return config, creds
