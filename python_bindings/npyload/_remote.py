"""The configuration of remote shards (``s3://``, ``https://``) for
``Loader(remote=...)``: the C library's ``npyload_remote`` built from the
arguments and, for what they leave out, from the standard AWS environment
variables and ``~/.aws`` files, as boto3 users expect. The library itself
reads no environment variable.

Precedence, per setting: ``remote=`` > environment > the profile's entries
in ``~/.aws/config`` / ``~/.aws/credentials`` (``AWS_CONFIG_FILE``,
``AWS_SHARED_CREDENTIALS_FILE`` move them). A profile named explicitly
(``remote={"profile": ...}``) supplies the credentials even when
``AWS_ACCESS_KEY_ID`` is set, as in botocore. A custom endpoint uses
path-style addressing. Secrets are never put into a message.
"""
from __future__ import annotations

import configparser as _configparser
import math as _math
import os as _os
from collections.abc import Mapping, Sequence
from typing import Union

_Value = Union[str, int, float, bool, None]

_KEYS = ("endpoint", "region", "access_key", "secret_key", "session_token", "profile",
         "path_style", "anonymous", "cache_dir", "cache_bytes", "cache_block", "timeout",
         "connect_timeout", "retries", "retry_base", "max_inflight", "ca_file", "proxy",
         "list_max_keys")
_STYLES = {"auto": 0, "path": 1, "virtual": 2}


def is_remote(path: str) -> bool:
    """True for s3://, http:// and https:// paths."""
    p = path[:8].lower()
    return p.startswith(("s3://", "http://", "https://"))


def _read_ini(path: str) -> _configparser.RawConfigParser | None:
    if not _os.path.isfile(path):
        return None
    cp = _configparser.RawConfigParser()
    try:
        cp.read(path)
    except _configparser.Error as e:  # the file is named, its values are not
        raise ValueError(f"remote: cannot parse {path}: {type(e).__name__}") from None
    return cp


def _aws_files(env: Mapping[str, str]) -> tuple[str, str]:
    home = _os.path.expanduser("~")
    cfg = env.get("AWS_CONFIG_FILE") or _os.path.join(home, ".aws", "config")
    cred = env.get("AWS_SHARED_CREDENTIALS_FILE") or _os.path.join(home, ".aws", "credentials")
    return _os.path.expanduser(cfg), _os.path.expanduser(cred)


def _profile_items(profile: str, env: Mapping[str, str]) -> tuple[dict[str, str], bool]:
    """The profile's entries (credentials file over config file) and whether
    the profile exists in either."""
    cfg_path, cred_path = _aws_files(env)
    items: dict[str, str] = {}
    found = False
    cfg = _read_ini(cfg_path)
    section = profile if profile == "default" else f"profile {profile}"
    if cfg is not None and cfg.has_section(section):
        found = True
        items.update({k: v.strip() for k, v in cfg.items(section)})
    cred = _read_ini(cred_path)
    if cred is not None and cred.has_section(profile):
        found = True
        items.update({k: v.strip() for k, v in cred.items(profile)})
    return items, found


def _seconds_ms(name: str, v: _Value) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not _math.isfinite(v) or v < 0:
        raise ValueError(f"remote: {name} must be a number of seconds >= 0, got {v!r}")
    ms = int(round(float(v) * 1000))
    return 1 if v and ms == 0 else ms


def _count(name: str, v: _Value, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ValueError(f"remote: {name} must be an int in {lo}..{hi}, got {v!r}")
    return v


def _text(name: str, v: _Value) -> str | None:
    if v is None or v == "":
        return None
    if isinstance(v, _os.PathLike):
        v = _os.fspath(v)
    if not isinstance(v, str):
        raise TypeError(f"remote: {name} must be a str, got {type(v).__name__}")
    return v


def build(remote: Mapping[str, _Value] | None, paths: Sequence[str],
          env: Mapping[str, str] | None = None) -> dict[str, str | int | None] | None:
    """The mapping for the extension's ``set_remote`` (the C members), or
    None when no path is remote and ``remote`` is None. Raises ValueError
    naming what is missing or wrong (never a secret)."""
    if remote is None and not any(is_remote(p) for p in paths):
        return None
    if remote is not None and not isinstance(remote, Mapping):
        raise TypeError(f"remote must be a mapping (dict), got {type(remote).__name__}")
    args = dict(remote or {})
    unknown = sorted(set(args) - set(_KEYS))
    if unknown:
        raise ValueError(f"remote: unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(_KEYS)}")
    env = _os.environ if env is None else env
    explicit_profile = _text("profile", args.get("profile"))
    profile = explicit_profile or env.get("AWS_PROFILE") or "default"
    items, found = _profile_items(profile, env)
    if (explicit_profile or env.get("AWS_PROFILE")) and not found:
        cfg_path, cred_path = _aws_files(env)
        raise ValueError(f"remote: AWS profile {profile!r} not found in {cfg_path} or "
                         f"{cred_path}")

    def pick(key: str, env_names: tuple[str, ...], file_key: str | None,
             use_env: bool = True) -> str | None:
        v = _text(key, args.get(key))
        if v is not None:
            return v
        if use_env:
            for n in env_names:
                if env.get(n):
                    return env[n]
        return items.get(file_key) or None if file_key else None

    anonymous = bool(args.get("anonymous", False))
    # An explicit profile supplies credentials over the environment's.
    env_creds = explicit_profile is None
    access = pick("access_key", ("AWS_ACCESS_KEY_ID",), "aws_access_key_id", env_creds)
    secret = pick("secret_key", ("AWS_SECRET_ACCESS_KEY",), "aws_secret_access_key", env_creds)
    token = pick("session_token", ("AWS_SESSION_TOKEN",), "aws_session_token", env_creds)
    if anonymous:
        access = secret = token = None
    elif (access is None) != (secret is None):
        missing = "secret_key (AWS_SECRET_ACCESS_KEY)" if secret is None else \
            "access_key (AWS_ACCESS_KEY_ID)"
        raise ValueError(f"remote: {missing} is missing while the other half of the "
                         f"credentials is set")
    if not anonymous and access is None and any(p.lower().startswith("s3://") for p in paths):
        raise ValueError(
            "remote: s3:// paths need credentials: remote={'access_key': ..., "
            "'secret_key': ...}, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or "
            f"profile {profile!r} in ~/.aws/credentials; remote={{'anonymous': True}} "
            "for a public bucket")
    endpoint = pick("endpoint", ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), "endpoint_url")
    region = pick("region", ("AWS_REGION", "AWS_DEFAULT_REGION"), "region")
    style = args.get("path_style", "auto")
    if isinstance(style, bool):
        style_n = 1 if style else 2
    elif isinstance(style, str) and style.lower() in _STYLES:
        style_n = _STYLES[style.lower()]
    else:
        raise ValueError(f"remote: path_style must be 'auto', 'path', 'virtual' or a bool, "
                         f"got {style!r}")
    out: dict[str, str | int | None] = {
        "endpoint": endpoint, "region": region, "access_key": access, "secret_key": secret,
        "session_token": token, "path_style": style_n,
        "cache_dir": _text("cache_dir", args.get("cache_dir")),
        "ca_file": pick("ca_file", ("AWS_CA_BUNDLE",), "ca_bundle"),
        "proxy": _text("proxy", args.get("proxy")),
    }
    if out["cache_dir"] is not None:
        out["cache_dir"] = _os.path.abspath(_os.path.expanduser(str(out["cache_dir"])))
    if args.get("cache_bytes") is not None:
        out["cache_bytes"] = _count("cache_bytes", args["cache_bytes"], 1, 2**62)
    if args.get("cache_block") is not None:
        out["cache_block"] = _count("cache_block", args["cache_block"], 4096, 2**30)
    if args.get("timeout") is not None:
        out["timeout_ms"] = _seconds_ms("timeout", args["timeout"])
    if args.get("connect_timeout") is not None:
        out["connect_timeout_ms"] = _seconds_ms("connect_timeout", args["connect_timeout"])
    if args.get("retry_base") is not None:
        out["retry_base_ms"] = _seconds_ms("retry_base", args["retry_base"])
    if args.get("retries") is not None:
        r = _count("retries", args["retries"], 0, 100)
        out["retries"] = r if r else -1  # 0 retries: the C library's -1
    if args.get("max_inflight") is not None:
        out["max_inflight"] = _count("max_inflight", args["max_inflight"], 1, 256)
    if args.get("list_max_keys") is not None:
        out["list_max_keys"] = _count("list_max_keys", args["list_max_keys"], 1, 1000)
    return out
