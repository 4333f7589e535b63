#!/usr/bin/env python3
"""Make the credentials of a Flower deployment: TLS certificates and SuperNode key pairs.

    python deploy/make-credentials.py OUT_DIR [--supernodes N] [--host NAME_OR_IP ...]

writes into OUT_DIR:

- ``ca.crt``, ``ca.key``: a self-signed certificate authority (keep ``ca.key`` offline);
- ``server.pem``, ``server.key``: the SuperLink's TLS certificate (signed by the CA) and key,
  valid for ``localhost``, ``127.0.0.1``, ``::1`` and every ``--host`` given (the name or IP
  address the SuperNodes and the ``flwr`` CLI use to reach the SuperLink);
- ``supernode-keys/supernode-<k>`` and ``supernode-<k>.pub`` for k = 0..N-1: the SuperNodes'
  authentication key pairs (ECDSA P-384, OpenSSH format, as ``flower-supernode
  --auth-supernode-private-key`` and ``flwr supernode register`` read them);
- ``supernode-keys/unregistered`` and ``unregistered.pub``: one more pair that is never meant to be
  registered (a SuperNode using it must be refused; the tests use it);
- ``node-map.json``: partition k -> the public key of ``supernode-<k>``, for the run config key
  ``node-map`` on the SuperLink machine (the ServerApp then gives partition k to the node
  authenticated with that key, not to whichever node claims it: ``fedgo_app/discovery.py``).

Copy ``ca.crt`` to every machine (SuperNodes and the one running ``flwr``), ``server.pem`` and
``server.key`` to the SuperLink machine only, and ``supernode-<k>`` to SuperNode machine k only.
Only needs the ``cryptography`` package (a dependency of flwr): no openssl/ssh-keygen.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import json
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if private:  # create with 0600 from the start, never world-readable
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
    else:
        path.write_bytes(data)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):  # keep order, drop duplicates
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_tls(out: Path, hosts: list[str], days: int) -> None:
    """Write ca.crt/ca.key and a CA-signed server.pem/server.key valid for ``hosts``."""
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedgo-flwr deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    _write(out / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(out / "ca.key", _key_pem(ca_key), private=True)
    _write(out / "server.pem", cert.public_bytes(serialization.Encoding.PEM))
    _write(out / "server.key", _key_pem(key), private=True)


def make_supernode_key(path: Path, comment: str) -> str:
    """Write an ECDSA P-384 key pair: ``path`` (OpenSSH private key) and ``path.pub``; return
    the public key's OpenSSH line."""
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write(path, private, private=True)
    line = public.decode() + f" {comment}"
    _write(path.with_name(path.name + ".pub"), f"{line}\n".encode())
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Make a CA, a SuperLink TLS certificate and SuperNode auth key pairs.",
    )
    parser.add_argument("out_dir", type=Path, help="output directory (created if missing)")
    parser.add_argument(
        "--supernodes", "-n", type=int, default=3, help="SuperNode key pairs to make (default 3)"
    )
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="extra name or IP address of the SuperLink machine for the certificate's SANs "
        "(repeatable; localhost, 127.0.0.1 and ::1 are always included)",
    )
    parser.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    parser.add_argument(
        "--force", action="store_true", help="overwrite credentials already in OUT_DIR"
    )
    args = parser.parse_args(argv)
    if args.supernodes < 0:
        parser.error("--supernodes must be >= 0")

    out: Path = args.out_dir
    if (out / "ca.crt").exists() and not args.force:
        parser.error(f"{out / 'ca.crt'} exists; pass --force to overwrite")
    hosts = [*args.host, *DEFAULT_HOSTS]
    make_tls(out, hosts, args.days)
    keys = out / "supernode-keys"
    node_map = {
        str(k): make_supernode_key(keys / f"supernode-{k}", f"fedgo-supernode-{k}")
        for k in range(args.supernodes)
    }
    make_supernode_key(keys / "unregistered", "fedgo-supernode-unregistered")
    _write(out / "node-map.json", (json.dumps(node_map, indent=1) + "\n").encode())
    print(
        f"wrote {out}/ca.crt, server.pem, server.key (SANs: {', '.join(dict.fromkeys(hosts))}), "
        f"{args.supernodes} SuperNode key pairs (+1 unregistered) in {keys} and their "
        f"partitions in {out}/node-map.json"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
