"""`python -m bench [NAME ...]`: run every benchmark (or the named ones); reports go to runs/bench/."""

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main() -> None:
    names = sys.argv[1:] or sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if not m.name.startswith("_"))
    failed = []
    for name in names:
        started = time.time()
        print(f"== bench.{name}", flush=True)
        try:
            importlib.import_module(f"bench.{name}").main()
        except Exception as error:  # one broken benchmark should not hide the others' numbers
            failed.append(name)
            print(f"bench.{name} failed: {type(error).__name__}: {error}", flush=True)
        print(f"== bench.{name}: {time.time() - started:.0f} s", flush=True)
    if failed:
        raise SystemExit(f"failed benchmarks: {', '.join(failed)}")


if __name__ == "__main__":
    main()
