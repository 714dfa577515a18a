#!/usr/bin/env python3
"""Each layer may include only itself and src/common (and its own public
headers): an algorithm never sees a transport, a transport never sees an
algorithm. Exits 1 naming every include that crosses a boundary."""
import pathlib
import re
import sys

ALLOWED = {
    "algorithms": ("algorithms/", "src/common/"),
    "transports": ("transports/", "src/common/"),
    "topology": ("topology/", "src/common/"),
    "src/common": ("src/common/", "braid_config.h"),
}
root = pathlib.Path(sys.argv[1])
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
problems = []
for layer, allowed in ALLOWED.items():
    for path in sorted((root / layer).rglob("*")):
        if path.suffix not in (".h", ".cc", ".cu"):
            continue
        for header in include.findall(path.read_text()):
            if not header.startswith(allowed):
                problems.append(f"{path.relative_to(root)} includes \"{header}\" (layer {layer} may include {', '.join(allowed)})")
for p in problems:
    print(p)
print(f"{len(problems)} include(s) across layer boundaries")
sys.exit(1 if problems else 0)
