#!/usr/bin/env python3
"""Writes an OCI image archive (an OCI image layout in a tar) without a
container engine or a registry: one image index with one manifest per
platform, each image a single layer holding one static binary (the
platform's own) and any platform-independent files given with --file.

  oci.py --out controller.tar --name ghcr.io/mountguard/mountguard-controller:0.1.0 \
    --platform linux/amd64=target/x86_64-unknown-linux-musl/release/mountguard-controller \
    --platform linux/arm64=target/aarch64-unknown-linux-musl/release/mountguard-controller \
    --path /mountguard-controller --entrypoint /mountguard-controller --cmd run \
    --user 65532:65532 --label org.opencontainers.image.title=mountguard-controller \
    --file /etc/ssl/certs/ca-certificates.crt=/etc/ssl/certs/ca-certificates.crt:0644 \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt

The layout is what a multi-platform registry push holds (an
`application/vnd.oci.image.index.v1+json` pointing at
`application/vnd.oci.image.manifest.v1+json` manifests; image-spec
image-layout.md, image-index.md, manifest.md, config.md); `skopeo copy --all
oci-archive:OUT docker://...` pushes it unchanged and `ctr images import`
reads it. The output is byte-for-byte reproducible: every timestamp is
SOURCE_DATE_EPOCH (default 0), owners are 0:0, layer entries are sorted
(directories first, 0755). Prints the index digest (sha256:...) on stdout,
which is what a pod references (`repository@sha256:...`).
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


def parse_file(spec):
    """`SRC=DEST[:MODE]` (MODE octal, default 0644) -> (src, dest, mode)."""
    src, sep, dest = spec.partition("=")
    dest, colon, mode = dest.partition(":")
    ok = sep and src and dest.startswith("/") and dest.strip("/")
    ok = ok and (not colon or (mode and set(mode) <= set("01234567") and int(mode, 8) <= 0o7777))
    if not ok:
        raise SystemExit(f"oci.py: --file {spec!r}: want SRC=/ABSOLUTE/DEST[:OCTAL MODE]")
    return src, dest, int(mode, 8) if colon else 0o644


def parse_dir(spec):
    """`/ABSOLUTE/DIR[:MODE]` (MODE octal, default 0755) -> (dir, mode)."""
    path, colon, mode = spec.partition(":")
    ok = path.startswith("/") and path.strip("/")
    ok = ok and (not colon or (mode and set(mode) <= set("01234567") and int(mode, 8) <= 0o7777))
    if not ok:
        raise SystemExit(f"oci.py: --dir {spec!r}: want /ABSOLUTE/DIR[:OCTAL MODE]")
    return path, int(mode, 8) if colon else 0o755


def parse_symlink(spec):
    """`/ABSOLUTE/PATH=TARGET` -> (path, target)."""
    path, sep, target = spec.partition("=")
    if not (sep and path.startswith("/") and path.strip("/") and target):
        raise SystemExit(f"oci.py: --symlink {spec!r}: want /ABSOLUTE/PATH=TARGET")
    return path, target


def layer(files, epoch, modes=(), links=()):
    """A gzip tar of `files` ((source, path in image, mode) triples), the
    directories of `modes` ((path, mode) pairs, empty unless a file is in
    them) and every parent directory of their paths (0755 unless `modes`
    names it), directories first, each group sorted by path, so the bytes
    depend only on the files' contents."""
    dir_modes = {"/".join(p for p in d.split("/") if p): m for d, m in modes}
    symlinks = {"/".join(p for p in l.split("/") if p): t for l, t in links}
    entries = {}
    for src, path, mode in files:
        parts = [p for p in path.split("/") if p]
        if not parts or {".", ".."} & set(parts):
            raise SystemExit(f"oci.py: {path}: not a normal absolute path")
        name = "/".join(parts)
        if name in entries:
            raise SystemExit(f"oci.py: {path} given twice")
        with open(src, "rb") as f:
            entries[name] = (f.read(), mode)
    dirs = sorted(
        {"/".join(n.split("/")[:i]) for n in entries for i in range(1, n.count("/") + 1)}
        | {"/".join(d.split("/")[:i]) for d in dir_modes for i in range(1, d.count("/") + 2)}
        | {"/".join(n.split("/")[:i]) for n in symlinks for i in range(1, n.count("/") + 1)}
    )
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in dirs:
            if name in entries:
                raise SystemExit(f"oci.py: /{name} is both a file and a directory")
            d = tarfile.TarInfo(name)
            d.type, d.mode, d.mtime = tarfile.DIRTYPE, dir_modes.get(name, 0o755), epoch
            tar.addfile(d)
        for name in sorted(symlinks):
            if name in entries or name in dirs:
                raise SystemExit(f"oci.py: /{name} is a symlink and a file or directory")
            t = tarfile.TarInfo(name)
            t.type, t.linkname, t.mode, t.mtime = tarfile.SYMTYPE, symlinks[name], 0o777, epoch
            tar.addfile(t)
        for name in sorted(entries):
            data, mode = entries[name]
            t = tarfile.TarInfo(name)
            t.size, t.mode, t.mtime = len(data), mode, epoch
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
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE, after PATH")
    ap.add_argument(
        "--file",
        action="append",
        default=[],
        help="SRC=DEST[:MODE]: add file SRC at DEST (mode octal, default 0644) to every platform",
    )
    ap.add_argument(
        "--dir",
        action="append",
        default=[],
        help="/DIR[:MODE]: add directory DIR (mode octal, default 0755) to every platform",
    )
    ap.add_argument(
        "--symlink",
        action="append",
        default=[],
        help="/PATH=TARGET: add a symbolic link at PATH to TARGET to every platform",
    )
    a = ap.parse_args()

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = "%04d-%02d-%02dT%02d:%02d:%02dZ" % __import__("time").gmtime(epoch)[:6]
    labels = dict(kv.split("=", 1) for kv in a.label)
    extra = [parse_file(spec) for spec in a.file]
    dirs = [parse_dir(spec) for spec in a.dir]
    links = [parse_symlink(spec) for spec in a.symlink]
    blobs = Blobs()
    manifests = []
    for spec in a.platform:
        plat, binary = spec.split("=", 1)
        os_name, arch = plat.split("/", 1)
        gz, diff_id = layer([(binary, a.path, 0o755)] + extra, epoch, dirs, links)
        config = {
            "architecture": arch,
            "os": os_name,
            "created": created,
            "config": {
                "Entrypoint": a.entrypoint,
                "Cmd": a.cmd,
                "User": a.user,
                "Labels": labels,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env,
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [
                {
                    "created": created,
                    "created_by": "oci.py: "
                    + ", ".join(
                        f"{dest} from {os.path.basename(src)}"
                        for src, dest, _ in [(binary, a.path, 0)] + extra
                    ),
                }
            ],
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
