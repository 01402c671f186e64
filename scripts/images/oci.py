#!/usr/bin/env python3
"""Writes an OCI image archive (an OCI image layout in a tar) without a
container engine or a registry: one image index with one manifest per
platform, each image a single layer holding one static binary.

  oci.py --out agent.tar --name ghcr.io/mountguard/mountguard-agent:0.1.0 \
    --platform linux/amd64=target/x86_64-unknown-linux-musl/release/mountguard-agent \
    --platform linux/arm64=target/aarch64-unknown-linux-musl/release/mountguard-agent \
    --path /mountguard-agent --entrypoint /mountguard-agent --cmd run --user 0:0 \
    --label org.opencontainers.image.title=mountguard-agent

The layout is the one `docker buildx build --platform linux/amd64,linux/arm64`
pushes (an `application/vnd.oci.image.index.v1+json` pointing at
`application/vnd.oci.image.manifest.v1+json` manifests; image-spec
image-layout.md, image-index.md, manifest.md, config.md). The output is
byte-for-byte reproducible: every timestamp is SOURCE_DATE_EPOCH (default 0),
owners are 0:0. Prints the index digest (sha256:...) on stdout, which is what
a pod references (`repository@sha256:...`).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile

INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class Blobs:
    def __init__(self):
        self.blobs = {}

    def add(self, data, media_type, **extra):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def layer(binary, path, epoch):
    """A gzip tar with `path`'s parent directories and the binary (0755)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts)):
            d = tarfile.TarInfo("/".join(parts[:i]))
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, epoch
            tar.addfile(d)
        with open(binary, "rb") as f:
            data = f.read()
        t = tarfile.TarInfo("/".join(parts))
        t.size, t.mode, t.mtime = len(data), 0o755, epoch
        tar.addfile(t, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=epoch, compresslevel=6) as g:
        g.write(raw.getvalue())
    return gz.getvalue(), diff_id


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the image archive (tar) to write")
    ap.add_argument("--name", required=True, help="image reference recorded in the archive")
    ap.add_argument("--platform", action="append", required=True, help="os/arch=binary")
    ap.add_argument("--path", required=True, help="where the binary lives in the image")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--label", action="append", default=[], help="key=value")
    a = ap.parse_args()

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = "%04d-%02d-%02dT%02d:%02d:%02dZ" % __import__("time").gmtime(epoch)[:6]
    labels = dict(kv.split("=", 1) for kv in a.label)
    blobs = Blobs()
    manifests = []
    for spec in a.platform:
        plat, binary = spec.split("=", 1)
        os_name, arch = plat.split("/", 1)
        gz, diff_id = layer(binary, a.path, epoch)
        config = {
            "architecture": arch,
            "os": os_name,
            "created": created,
            "config": {
                "Entrypoint": a.entrypoint,
                "Cmd": a.cmd,
                "User": a.user,
                "Labels": labels,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": created, "created_by": f"oci.py: {a.path} from {os.path.basename(binary)}"}],
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": blobs.add(canonical(config), CONFIG),
            "layers": [blobs.add(gz, LAYER)],
            "annotations": {"org.opencontainers.image.created": created},
        }
        manifests.append(
            blobs.add(canonical(manifest), MANIFEST, platform={"architecture": arch, "os": os_name})
        )
    index = {"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests}
    index_desc = blobs.add(canonical(index), INDEX)
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    layout_index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            dict(
                index_desc,
                annotations={
                    "io.containerd.image.name": a.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            )
        ],
    }

    def add(tar, name, data):
        t = tarfile.TarInfo(name)
        t.size, t.mode, t.mtime = len(data), 0o644, epoch
        tar.addfile(t, io.BytesIO(data))

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
        add(tar, "index.json", canonical(layout_index))
        for digest in sorted(blobs.blobs):
            add(tar, "blobs/sha256/" + digest.split(":", 1)[1], blobs.blobs[digest])
    os.replace(tmp, a.out)
    print(index_desc["digest"])


if __name__ == "__main__":
    sys.exit(main())
