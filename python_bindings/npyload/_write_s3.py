"""npyload.write to ``s3://bucket/prefix``: the store of ``_write_store``'s
table on object storage, through boto3 (``pip install npyload[s3]``).

Why boto3 and not pyarrow's S3FileSystem: the writer keeps who made an
object and the sha256 of its data in the object's own user metadata
(``x-amz-meta-npyload-*``), written with the object in one request, so
that resume and the "never replace a file the writer did not make" rule
need no journal beside the objects; boto3's HEAD returns that metadata,
pyarrow's S3 filesystem does not expose it. boto3's transfer manager does
multipart uploads (``MULTIPART`` bytes and more) with retries.

Endpoint and credentials follow the loader's ``remote=`` rules exactly:
``_remote.build`` resolves them (arguments, AWS environment, ~/.aws).
An object becomes visible only when its upload completes (a PUT, or a
multipart upload's completion), so no partial object is ever seen under
its final name. There is no lock on object storage: run one writer per
prefix.
"""
from __future__ import annotations

import json as _json
import os as _os
import tempfile as _tempfile
import threading as _threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor as _Pool
from typing import Any

from . import _remote
from ._write_store import FOREIGN, Entry, Record, sha256_file

MULTIPART = 64 << 20        # bytes: objects at least this large go up in parts of this size
_META = "npyload-write"     # the user metadata key that marks the writer's objects
_STATE = ".npyload-write/{split}.json"


def _split_url(url: str) -> tuple[str, str]:
    rest = url[5:]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"{url}: s3:// URLs are s3://BUCKET/PREFIX")
    return bucket, key.strip("/")


class S3Client:
    """A boto3 S3 client configured as Loader(remote=...) would be."""

    def __init__(self, url: str, remote: Mapping[str, Any] | None,
                 cfg: Mapping[str, Any] | None = None) -> None:
        """remote: Loader's remote= mapping, resolved with the AWS
        environment and ~/.aws (_remote.build); cfg: a configuration
        already resolved (what config() returned, on another process)."""
        try:
            import boto3  # type: ignore[import-untyped,unused-ignore]
            from botocore.config import Config  # type: ignore[import-untyped,unused-ignore]
        except ImportError:
            raise ImportError("npyload.write to s3:// and s3:// manifests need boto3: "
                              "pip install 'npyload[s3]'") from None
        if cfg is None:
            cfg = _remote.build(remote, [url])
        assert cfg is not None
        self.cfg = dict(cfg)
        style = {0: "auto", 1: "path", 2: "virtual"}[int(cfg.get("path_style") or 0)]
        if cfg.get("endpoint") and style == "auto":
            style = "path"   # a custom endpoint uses path-style addressing (_remote's rule)
        kw: dict[str, Any] = {"s3": {"addressing_style": style},
                              "retries": {"max_attempts": 10, "mode": "standard"}}
        if cfg.get("proxy"):
            kw["proxies"] = {"http": cfg["proxy"], "https": cfg["proxy"]}
        if not cfg.get("access_key"):
            from botocore import UNSIGNED  # type: ignore[import-untyped,unused-ignore]
            kw["signature_version"] = UNSIGNED
        self.client = boto3.session.Session().client(
            "s3", endpoint_url=cfg.get("endpoint") or None,
            region_name=cfg.get("region") or "us-east-1",
            aws_access_key_id=cfg.get("access_key"),
            aws_secret_access_key=cfg.get("secret_key"),
            aws_session_token=cfg.get("session_token"),
            verify=cfg.get("ca_file") or None, config=Config(**kw))

    def get_bytes(self, url: str) -> bytes:
        bucket, key = _split_url(url)
        try:
            return bytes(self.client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except self.client.exceptions.NoSuchKey:
            raise FileNotFoundError(f"{url}: no such object") from None


class S3Placer:
    """Uploads one object of an s3:// out: the file is made in a temporary
    directory of the process that runs it (packed there when asked), then
    uploaded with the writer's facts in its metadata, in one PUT or a
    multipart upload; the object appears when the upload completes, so a
    killed upload leaves nothing under the final key (an unfinished
    multipart upload at most, which the writer aborts at the end)."""

    def __init__(self, out: str, cfg: Mapping[str, Any]) -> None:
        self.out, self.cfg = out, dict(cfg)
        self.bucket, self.prefix = _split_url(out)
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"out": self.out, "cfg": self.cfg}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(d["out"], d["cfg"])  # type: ignore[misc]

    def place(self, rel: str, split: str, fid: int, fld: str, content: str, data: bytes,
              pack: Any) -> tuple[int, str]:
        """Uploads data at rel (packed, at rel + '.zst', by pack(path) when
        given); returns the object's (size, sha256)."""
        import shutil
        from boto3.s3.transfer import TransferConfig  # type: ignore[import-untyped,unused-ignore]
        if self._client is None:
            self._client = S3Client(self.out, None, self.cfg).client
        final = rel + ".zst" if pack is not None else rel
        tmp = _tempfile.mkdtemp(prefix="npyload-write-s3-")
        try:
            local = _os.path.join(tmp, _os.path.basename(rel))
            with open(local, "wb") as f:
                f.write(data)
            if pack is not None:
                pack(local)
                local += ".zst"
            size = _os.path.getsize(local)
            digest = content if pack is None else sha256_file(local)
            meta = _json.dumps({"split": split, "fid": fid, "field": fld, "content": content,
                                "sha256": digest, "size": size}, separators=(",", ":"))
            key = f"{self.prefix}/{final}" if self.prefix else final
            self._client.upload_file(local, self.bucket, key,
                                     ExtraArgs={"Metadata": {_META: meta}},
                                     Config=TransferConfig(multipart_threshold=MULTIPART,
                                                           multipart_chunksize=MULTIPART,
                                                           use_threads=False))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return size, digest


class S3Store:
    """`out` = s3://bucket/prefix. Ownership, content checksum and size of
    each object live in its metadata; a split's fingerprint and completion
    in a small state object (.npyload-write/SPLIT.json)."""

    def __init__(self, out: str, remote: Mapping[str, Any] | None) -> None:
        self.out = out.rstrip("/")
        self.bucket, self.prefix = _split_url(self.out)
        c = S3Client(out, remote)
        self.s3, self.cfg = c.client, c.cfg
        self.records: dict[str, Record] = {}
        self._owner: dict[str, Entry] = {}
        self._foreign: set[str] = set()
        self._mu = _threading.Lock()
        self._uploads: dict[str, list[str]] | None = None

    def key(self, rel: str) -> str:
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def where(self, rel: str) -> str:
        return f"{self.out}/{rel}"

    def open(self) -> None:
        """Lists the prefix and reads each object's metadata (HEAD)."""
        keys: list[tuple[str, int]] = []
        pfx = self.key("")
        for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=pfx):
            keys += [(o["Key"], int(o["Size"])) for o in page.get("Contents", [])]
        state = self.key(".npyload-write/")

        def head(k: str) -> dict[str, Any]:
            return dict(self.s3.head_object(Bucket=self.bucket, Key=k))

        with _Pool(max_workers=16) as pool:
            heads = list(pool.map(head, [k for k, _ in keys]))
        for (k, size), h in zip(keys, heads):
            rel = k[len(pfx):]
            if k.startswith(state) and k.endswith(".json"):
                body = self.s3.get_object(Bucket=self.bucket, Key=k)["Body"].read()
                d = _json.loads(body)
                r = self.records.setdefault(d["split"], Record(d["spec"]))
                r.spec, r.samples = d["spec"], d.get("samples")
                continue
            meta = h.get("Metadata", {})
            if _META not in meta:
                self._foreign.add(rel)
                continue
            m = _json.loads(meta[_META])
            e = Entry(rel, m["split"], int(m["fid"]), m["field"], m["content"], size,
                      m["sha256"])
            if size != int(m["size"]):
                e.pending = True   # not as written: rewritten
            self._owner[rel] = e
            self.records.setdefault(e.split, Record("")).files[rel] = e

    def close(self) -> None:
        pass

    def _state(self, split: str) -> None:
        r = self.records[split]
        self.s3.put_object(Bucket=self.bucket, Key=self.key(_STATE.format(split=split)),
                           Body=_json.dumps({"split": split, "spec": r.spec,
                                             "samples": r.samples}).encode())

    def begin(self, split: str, spec: str) -> None:
        with self._mu:
            r = self.records.setdefault(split, Record(spec))
            r.spec, r.samples = spec, None
            self._state(split)

    def complete(self, split: str, samples: int) -> None:
        with self._mu:
            self.records[split].samples = samples
            self._state(split)

    def drop(self, split: str) -> None:
        with self._mu:
            self.records.pop(split, None)
            self.s3.delete_object(Bucket=self.bucket, Key=self.key(_STATE.format(split=split)))

    def entry(self, rel: str) -> Entry | str | None:
        e = self._owner.get(rel)
        if e is not None:
            return e
        return FOREIGN if rel in self._foreign else None

    def intact(self, e: Entry) -> bool:
        return not e.pending   # objects change only whole; size checked at open

    def inside(self, rel: str) -> None:
        pass                   # keys have no links; names were checked (_Names)

    def placer(self) -> S3Placer:
        """What uploads this store's objects: picklable (the configuration,
        resolved here, travels; the client is made where it runs)."""
        return S3Placer(self.out, self.cfg)

    def intend(self, rel: str, split: str, fid: int, fld: str, packed: bool) -> str:
        return rel + ".zst" if packed else rel   # an object appears whole or not at all

    def record(self, final: str, split: str, fid: int, fld: str, content: str, size: int,
               sha256: str) -> Entry:
        e = Entry(final, split, fid, fld, content, size, sha256)
        with self._mu:
            old = self._owner.pop(final, None)
            if old is not None and old.split in self.records:
                self.records[old.split].files.pop(final, None)
            self._owner[final] = e
            self.records.setdefault(split, Record("")).files[final] = e
        return e

    def put(self, rel: str, split: str, fid: int, fld: str, content: str, data: bytes,
            pack: Any) -> Entry:
        final = self.intend(rel, split, fid, fld, pack is not None)
        size, digest = self.placer().place(rel, split, fid, fld, content, data, pack)
        return self.record(final, split, fid, fld, content, size, digest)

    def remove(self, e: Entry) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=self.key(e.path))
        with self._mu:
            self._owner.pop(e.path, None)
            if e.split in self.records:
                self.records[e.split].files.pop(e.path, None)

    def tidy(self, rel: str, packed: bool) -> None:
        """Aborts unfinished multipart uploads to this file's key (a worker
        killed mid-upload; invisible, but they hold storage). Uploads appear
        whole or not at all, so there is nothing else to tidy."""
        if self._uploads is None:
            self._uploads = {}
            try:
                for page in self.s3.get_paginator("list_multipart_uploads").paginate(
                        Bucket=self.bucket, Prefix=self.key("")):
                    for u in page.get("Uploads", []):
                        self._uploads.setdefault(u["Key"], []).append(u["UploadId"])
            except self.s3.exceptions.ClientError:
                return         # a server without the listing: nothing to abort here
        for k in (self.key(rel + ".zst" if packed else rel),):
            for uid in self._uploads.pop(k, []):
                try:
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=uid)
                except self.s3.exceptions.ClientError:
                    pass
