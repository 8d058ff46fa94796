"""``python -m npyload info``: the build and machine facts for a bug report
(npyload.build_info()). Any other subcommand, or none, prints the usage and
exits with status 2."""
from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: python -m npyload info

  info    print npyload's build and what it finds on this machine (io_uring,
          zstd, the CUDA runtime, device kernels, CPU features, defaults,
          Python, numpy and torch versions): paste it into bug reports
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["info"]:
        from ._info import format_info
        sys.stdout.write(format_info())
        return 0
    if args in (["-h"], ["--help"], ["help"]):
        sys.stdout.write(USAGE)
        return 0
    if args:
        sys.stderr.write(f"python -m npyload: unknown command {' '.join(args)!r}\n")
    sys.stderr.write(USAGE)
    return 2


if __name__ == "__main__":
    sys.exit(main())
