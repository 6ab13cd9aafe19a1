"""SSH keys, user data, quotes and multi-period renewal (SQLite and PostgreSQL)."""

from __future__ import annotations

import email
import json
import subprocess
from datetime import datetime

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from vpsshop import ServerSpec, compose_user_data
from vpsshop.models import Server
from vpsshop.servers.jobs import _prepare
from vpsshop.testing import create_test_account
from vpsshop_libvirt import seed_files

ORDER = {"plan": "pup", "location": "nl", "os": "debian-12"}


def openssh(key) -> str:
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()


def ssh_keygen_fingerprint(line: str, tmp_path) -> str:
    path = tmp_path / "k.pub"
    path.write_text(line + "\n")
    return subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)], capture_output=True, text=True, check=True
    ).stdout.split()[1]


@pytest.mark.parametrize(
    "make, kind, bits",
    [
        (lambda: ed25519.Ed25519PrivateKey.generate(), "ed25519", 256),
        (lambda: ec.generate_private_key(ec.SECP256R1()), "ecdsa", 256),
        (lambda: ec.generate_private_key(ec.SECP384R1()), "ecdsa", 384),
        (lambda: rsa.generate_private_key(65537, 2048), "rsa", 2048),
    ],
)
def test_accepted_keys_are_stored_with_openssh_fingerprint(vpsshop_client, vpsshop_account, tmp_path, make, kind, bits):
    line = openssh(make())
    response = vpsshop_client.post(
        "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": "laptop", "public_key": line + " me@laptop"}
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["key_type"], body["bits"], body["public_key"]) == (kind, bits, line)
    assert body["fingerprint"] == ssh_keygen_fingerprint(line, tmp_path)
    listed = vpsshop_client.get("/v1/ssh-keys", headers=vpsshop_account.headers).json()["ssh_keys"]
    assert listed == [body]
    again = vpsshop_client.post(
        "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": "same", "public_key": line}
    )
    assert again.status_code == 409 and again.json()["error"] == "ssh_key_exists"


@pytest.mark.parametrize(
    "public_key, says",
    [
        (lambda: openssh(rsa.generate_private_key(65537, 1024)), "1024 bits"),
        (lambda: "ssh-dss AAAAB3NzaC1kc3MAAACBAP", "ssh-dss"),
        (lambda: "ssh-ed25519 AAAAnotbase64!", "not an OpenSSH public key"),
        (lambda: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB", "does not decode"),
        (lambda: 'command="rm -rf /" ' + openssh(ed25519.Ed25519PrivateKey.generate()), "without options"),
        (lambda: openssh(ed25519.Ed25519PrivateKey.generate()) + "\nssh-rsa AAAA", "not an OpenSSH public key"),
        (lambda: "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29t", "not accepted"),
    ],
)
def test_other_keys_are_a_clear_400(vpsshop_client, vpsshop_account, public_key, says):
    response = vpsshop_client.post(
        "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": "bad", "public_key": public_key()}
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid_public_key" and says in response.json()["message"]
    assert vpsshop_client.get("/v1/ssh-keys", headers=vpsshop_account.headers).json()["ssh_keys"] == []


def test_keys_are_per_account_and_deletable(vpsshop_client, vpsshop_account):
    line = openssh(ed25519.Ed25519PrivateKey.generate())
    key = vpsshop_client.post(
        "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": "a", "public_key": line}
    ).json()
    other = create_test_account(vpsshop_client)
    assert vpsshop_client.get("/v1/ssh-keys", headers=other.headers).json()["ssh_keys"] == []
    assert vpsshop_client.delete(f"/v1/ssh-keys/{key['id']}", headers=other.headers).status_code == 404
    other.credit("10")
    order = vpsshop_client.post("/v1/servers", headers=other.headers, json={**ORDER, "ssh_keys": [key["id"]]})
    assert order.status_code == 400 and order.json()["error"] == "invalid_ssh_keys"
    assert vpsshop_client.get("/v1/account", headers=other.headers).json()["balance_usd"] == 10  # nothing charged
    for huge in (2**63, 10**35):  # past the database's integer: refused, not an overflow (found by schemathesis)
        for path in ("/v1/servers", "/v1/servers/quote"):
            answer = vpsshop_client.post(path, headers=other.headers, json={**ORDER, "ssh_keys": [huge]})
            assert answer.status_code == 400 and answer.json()["error"] == "invalid_ssh_keys", answer.text
    assert vpsshop_client.delete(f"/v1/ssh-keys/{key['id']}", headers=vpsshop_account.headers).status_code == 200
    assert vpsshop_client.get("/v1/ssh-keys", headers=vpsshop_account.headers).json()["ssh_keys"] == []


def test_order_keys_and_user_data_reach_the_spec(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("10")
    lines = [openssh(ed25519.Ed25519PrivateKey.generate()) for _ in range(2)]
    ids = [
        vpsshop_client.post(
            "/v1/ssh-keys", headers=vpsshop_account.headers, json={"name": f"k{i}", "public_key": line}
        ).json()["id"]
        for i, line in enumerate(lines)
    ]
    user_data = "#cloud-config\npackages: [htop]\nssh_authorized_keys: [ssh-ed25519 AAAAextra]\n"
    order = vpsshop_client.post(
        "/v1/servers", headers=vpsshop_account.headers, json={**ORDER, "ssh_keys": ids, "user_data": user_data}
    )
    assert order.status_code == 201, order.text
    assert order.json()["root_password"]  # a password is still generated and returned once
    sid = order.json()["server"]["id"]
    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:
        row = session.get(Server, sid)
        assert row.user_data_enc.startswith("gAAAA") and "htop" not in row.user_data_enc  # encrypted at rest
    # Deleting a stored key later does not change the server's copy.
    vpsshop_client.delete(f"/v1/ssh-keys/{ids[0]}", headers=vpsshop_account.headers)
    _, spec = _prepare(ctx, sid)
    assert spec.ssh_keys == tuple(lines) and spec.user_data == user_data
    assert spec.root_password == order.json()["root_password"]


def alias_bomb(levels: int) -> str:
    """``levels`` nested levels of 10 aliases each: 9 levels are about 500 bytes and 10^9 strings."""
    lines = ["#cloud-config", "l0: &l0 [" + ", ".join(["lol"] * 10) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "user_data, says",
    [
        ("echo hi", "must start with"),
        ("#cloud-config\n- a list\n", "YAML mapping"),
        ("#cloud-config\nkey: [unclosed\n", "not valid YAML"),
        ("#!/bin/sh\n" + "x" * 17000, "at most"),
        (alias_bomb(9), "aliases expand it to more than 65536 characters"),
        (alias_bomb(6), "aliases expand it to more than 65536 characters"),
        ("#cloud-config\nloop: &me [*me]\n", "contains itself through a YAML alias"),
        ("#cloud-config\ndeep: " + "[" * 3000 + "]" * 3000 + "\n", "more than 64 levels deep"),
        ("#cloud-config\nruncmd: echo hi\n", "runcmd must be a YAML list"),
        ("#cloud-config\nssh_authorized_keys: {a: b}\n", "ssh_authorized_keys must be a list"),
    ],
)
def test_bad_user_data_is_400_before_any_charge(vpsshop_client, vpsshop_account, user_data, says):
    vpsshop_account.credit("10")
    response = vpsshop_client.post(
        "/v1/servers", headers=vpsshop_account.headers, json={**ORDER, "user_data": user_data}
    )
    assert response.status_code == 400 and response.json()["error"] == "invalid_user_data"
    assert says in response.json()["message"]
    assert vpsshop_client.get("/v1/servers", headers=vpsshop_account.headers).json()["servers"] == []


def _spec(**values) -> ServerSpec:
    return ServerSpec(
        name="vps-1-ab",
        hostname="web",
        location="nl",
        vcpu=1,
        memory_mib=512,
        disk_gib=10,
        os_id="debian-12",
        os_image="img",
        root_password="Secret-pass-123",
        ip="10.0.0.5",
        gateway="10.0.0.1",
        **values,
    )


def test_user_data_cannot_drop_keys_password_or_network():
    spec = _spec(
        ssh_keys=("ssh-ed25519 AAAAours",),
        user_data=(
            "#cloud-config\nhostname: evil\nchpasswd: {users: []}\nssh_pwauth: false\n"
            "ssh_authorized_keys: [ssh-ed25519 AAAAtheirs]\nwrite_files: [{path: /x, content: y}]\npackages: [htop]\n"
        ),
    )
    files = seed_files(spec)
    user = yaml.safe_load(files["user-data"])
    assert files["user-data"].startswith("#cloud-config\n")
    assert user["hostname"] == "web" and user["ssh_pwauth"] is True
    [root] = user["chpasswd"]["users"]
    assert root["name"] == "root" and root["type"] == "hash" and root["password"].startswith("$6$")
    assert user["ssh_authorized_keys"] == ["ssh-ed25519 AAAAtheirs", "ssh-ed25519 AAAAours"]
    assert [f["path"] for f in user["write_files"]] == [
        "/x",
        "/etc/ssh/sshd_config.d/60-vpsshop-root-login.conf",
        "/usr/local/lib/vpsshop/report-boot",  # the guest's reporter and its unit (docs/servers.md, "Ready means")
        "/etc/systemd/system/vpsshop-report-boot.service",
    ]
    assert user["runcmd"] == [["systemctl", "start", "--no-block", "vpsshop-report-boot.service"]]
    assert user["bootcmd"][0][:3] == ["cloud-init-per", "instance", "vpsshop-hold-ssh"]
    assert user["packages"] == ["htop"]
    network = json.loads(files["network-config"])  # a separate file: user data never touches it
    assert network["ethernets"]["primary"]["addresses"] == ["10.0.0.5/24"]


def test_the_seed_carries_the_root_passwords_hash_never_the_password():
    """sha512-crypt, which every catalog guest's libc checks; a fresh salt for each seed. The hash is
    checked with the system's crypt(3) (tests/seed_secrets.py), not with the library that made it."""
    from passlib.hash import sha512_crypt
    from seed_secrets import crypt_verifies

    spec = _spec(user_data="#cloud-config\nchpasswd: {users: [{name: root, password: mine, type: text}]}\n")
    first, second = seed_files(spec), seed_files(spec)
    for files in (first, second):
        assert not any("Secret-pass-123" in text for text in files.values())
    hashes = [yaml.safe_load(f["user-data"])["chpasswd"]["users"] for f in (first, second)]
    assert [[(u["name"], u["type"]) for u in users] for users in hashes] == [[("root", "hash")]] * 2
    one, two = hashes[0][0]["password"], hashes[1][0]["password"]
    assert one.startswith("$6$rounds=656000$") and one != two  # salted afresh
    assert crypt_verifies("Secret-pass-123", one) and crypt_verifies("Secret-pass-123", two)
    assert not crypt_verifies("Secret-pass-124", one)
    assert sha512_crypt.verify("Secret-pass-123", one)


def test_a_small_alias_bomb_would_have_been_megabytes():
    """What the 400 above prevents: composing even a 6-level bomb wrote tens of megabytes."""
    expanded = len(json.dumps(yaml.safe_load(alias_bomb(6))))
    assert len(alias_bomb(6)) < 400 and expanded > 5_000_000


def test_anchors_that_expand_modestly_are_accepted():
    user_data = "#cloud-config\nx-base: &base {owner: root, permissions: '0644'}\nwrite_files:\n"
    user_data += "".join(f"  - {{<<: *base, path: /etc/f{i}, content: '{i}'}}\n" for i in range(5))
    user = yaml.safe_load(seed_files(_spec(user_data=user_data))["user-data"])
    assert [f["path"] for f in user["write_files"]][:5] == [f"/etc/f{i}" for i in range(5)]
    assert user["write_files"][0]["owner"] == "root"


def test_one_ssh_key_as_a_string_is_kept_as_cloud_init_reads_it():
    spec = _spec(
        ssh_keys=("ssh-ed25519 AAAAours",), user_data="#cloud-config\nssh_authorized_keys: ssh-rsa AAAAtheirs\n"
    )
    user = yaml.safe_load(seed_files(spec)["user-data"])
    assert user["ssh_authorized_keys"] == ["ssh-rsa AAAAtheirs", "ssh-ed25519 AAAAours"]


def test_script_user_data_runs_after_vpsshops_cloud_config():
    composed = compose_user_data({"hostname": "web"}, "#!/bin/sh\necho hello > /tmp/hi\n")
    parts = [p for p in email.message_from_string(composed).walk() if not p.is_multipart()]
    assert [p.get_content_type() for p in parts] == ["text/cloud-config", "text/x-shellscript"]
    assert json.loads(parts[0].get_payload(decode=True).decode().split("\n", 1)[1]) == {"hostname": "web"}
    assert parts[1].get_payload(decode=True).decode() == "#!/bin/sh\necho hello > /tmp/hi\n"


# ---- quotes and renewals -------------------------------------------------------------------------


def _balance_micros(client, account) -> int:
    return round(client.get("/v1/account", headers=account.headers).json()["balance_usd"] * 1_000_000)


@pytest.mark.parametrize("cycle", ["monthly", "annual"])
def test_order_quote_writes_nothing_and_equals_the_charge(vpsshop_client, vpsshop_account, cycle):
    vpsshop_account.credit("100")
    key = vpsshop_client.post(
        "/v1/ssh-keys",
        headers=vpsshop_account.headers,
        json={"name": "k", "public_key": openssh(ed25519.Ed25519PrivateKey.generate())},
    ).json()
    body = {**ORDER, "location": "ro", "cycle": cycle} if cycle == "annual" else {**ORDER, "cycle": cycle}
    # The exact order is quoted, settings that change no price included.
    body |= {
        "hostname": "web-1",
        "root_password": "Chosen-pass-123",
        "ssh_keys": [key["id"]],
        "user_data": "#cloud-config\npackages: [htop]\n",
    }
    quote = vpsshop_client.post("/v1/servers/quote", headers=vpsshop_account.headers, json=body)
    assert quote.status_code == 200, quote.text
    q = quote.json()
    assert q["balance_usd"] == 100 and q["sufficient"] is True and q["deficit_usd"] == 0 and q["periods"] == 1
    assert vpsshop_client.get("/v1/servers", headers=vpsshop_account.headers).json()["servers"] == []
    before = _balance_micros(vpsshop_client, vpsshop_account)
    order = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=body)
    charged = before - _balance_micros(vpsshop_client, vpsshop_account)
    assert charged == round(q["price_usd"] * 1_000_000) and order.json()["server"]["price_usd"] == q["price_usd"]
    assert datetime.fromisoformat(order.json()["server"]["expires_at"]) == datetime.fromisoformat(q["expires_at"])


def test_quote_shows_the_deficit(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("1")
    q = vpsshop_client.post("/v1/servers/quote", headers=vpsshop_account.headers, json=ORDER).json()
    assert (q["price_usd"], q["balance_usd"], q["deficit_usd"], q["sufficient"]) == (3.99, 1, 2.99, False)
    bad = vpsshop_client.post("/v1/servers/quote", headers=vpsshop_account.headers, json={**ORDER, "plan": "nope"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_plan"
    # What the order would refuse, the quote refuses too: a key of another account, user data it takes not.
    other = create_test_account(vpsshop_client)
    theirs = vpsshop_client.post(
        "/v1/ssh-keys",
        headers=other.headers,
        json={"name": "k", "public_key": openssh(ed25519.Ed25519PrivateKey.generate())},
    ).json()
    for change, code in (
        ({"ssh_keys": [theirs["id"]]}, "invalid_ssh_keys"),
        ({"user_data": alias_bomb(9)}, "invalid_user_data"),
    ):
        for path in ("/v1/servers/quote", "/v1/servers"):
            refused = vpsshop_client.post(path, headers=vpsshop_account.headers, json={**ORDER, **change})
            assert (refused.status_code, refused.json()["error"]) == (400, code), path


def test_renewal_for_several_periods_quote_equals_charge(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("100")
    sid = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:  # as the provisioning job leaves it
        row = session.get(Server, sid)
        row.status = "active"
        session.add(row)
    quote = vpsshop_client.post(f"/v1/servers/{sid}/renew/quote", headers=vpsshop_account.headers, json={"periods": 3})
    assert quote.status_code == 200, quote.text
    q = quote.json()
    assert q["periods"] == 3 and q["price_usd"] == pytest.approx(3 * 3.99) and q["period_price_usd"] == 3.99
    assert q["max_periods"] == 35  # expires in a month: 1 + 35 months fit in 1100 days
    before = _balance_micros(vpsshop_client, vpsshop_account)
    assert _balance_micros(vpsshop_client, vpsshop_account) == before  # the quote charged nothing
    renewed = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=vpsshop_account.headers, json={"periods": 3})
    assert renewed.status_code == 200, renewed.text
    charged = before - _balance_micros(vpsshop_client, vpsshop_account)
    assert charged == round(q["price_usd"] * 1_000_000) == round(renewed.json()["charged_usd"] * 1_000_000)
    assert renewed.json()["server"]["expires_at"] == q["expires_at"]
    # Without a body: one period, as before.
    one = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=vpsshop_account.headers)
    assert one.status_code == 200 and one.json()["charged_usd"] == 3.99


def test_periods_past_the_prepay_horizon_are_refused_before_money_moves(vpsshop_client, vpsshop_account):
    vpsshop_account.credit("1000")
    sid = vpsshop_client.post("/v1/servers", headers=vpsshop_account.headers, json=ORDER).json()["server"]["id"]
    ctx = vpsshop_client.app.state.ctx
    with ctx.db.session() as session:
        row = session.get(Server, sid)
        row.status = "active"
        session.add(row)
    before = _balance_micros(vpsshop_client, vpsshop_account)
    for path in (f"/v1/servers/{sid}/renew", f"/v1/servers/{sid}/renew/quote"):
        response = vpsshop_client.post(path, headers=vpsshop_account.headers, json={"periods": 40})
        assert response.status_code == 400 and response.json()["error"] == "invalid_periods"
        assert response.json()["max_periods"] == 35 and "1100 days" in response.json()["message"]
    zero = vpsshop_client.post(f"/v1/servers/{sid}/renew", headers=vpsshop_account.headers, json={"periods": 0})
    assert zero.status_code == 400 and zero.json()["error"] == "invalid_periods"
    assert _balance_micros(vpsshop_client, vpsshop_account) == before
    poor = create_test_account(vpsshop_client)
    assert vpsshop_client.post(f"/v1/servers/{sid}/renew/quote", headers=poor.headers).status_code == 404
