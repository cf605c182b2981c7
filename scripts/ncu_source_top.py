#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Where a kernel's warps stall, by role and by instruction, from Nsight Compute's source page.

Reads the per-instruction CSV that `ncu -i REPORT --page source --csv --print-source sass` writes
(scripts/device_prefill_ncu.sh saves it as ncu_<who>_source.csv) and prints, for each role of a
warp-specialized kernel, its share of the warp-stall samples, its stall mix and its most sampled
instructions with their SASS index and stall reasons. Roles are split at `USETMAXREG` (setmaxnreg):
the instructions before the first DEALLOC are the roles that claim registers (gdn_prefill's state
warpgroups), those after it the role that releases them (its chunk warpgroup); a kernel without
setmaxnreg is one role. The SASS index is the instruction's position in the kernel, the same as in
`kjit inspect '<spec>' --sass`, so a line can be found there with its neighbours.

    python3 scripts/ncu_source_top.py out/ncu_kjit_source.csv [top_n]

(Nsight Compute's source page has no column for wgmma's own stall reason: samples on an HGMMA
with no reason listed are most likely waits for the tensor core to take the instruction.)
"""
import collections
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source(path):
    """The source page's instruction rows and columns: (rows, source column, samples column,
    [(column, stall reason)]), or None where the file has no 'Source' column."""
    rows = list(csv.reader(open(path, errors="replace")))
    head = next((i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r]), None)
    if head is None:
        return None
    names = [c.strip() for c in rows[head]]
    samples = names.index("Warp Stall Sampling (All Samples)")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(names)
               if h.startswith("stall_") and "Not Issued" not in h]
    code = [r for r in rows[head + 1:] if len(r) > samples]
    return code, names.index("Source"), samples, reasons


def stall_mix(code, reasons):
    """Samples by stall reason over the instruction rows `code`."""
    mix = collections.Counter()
    for r in code:
        for i, reason in reasons:
            mix[reason] += number(r[i])
    return mix


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[0])
        print(f"usage: {argv[0]} SOURCE_CSV [top_n]")
        return 2
    top_n = int(argv[2]) if len(argv) > 2 else 12
    page = read_source(argv[1])
    if page is None:
        print(f"{argv[1]}: no 'Source' column: not an ncu source page")
        return 1
    code, source, samples, reasons = page
    split = next((i for i, r in enumerate(code) if "USETMAXREG.DEALLOC" in r[source]), None)
    roles = [("whole kernel", 0, len(code))] if split is None else [
        ("before setmaxnreg.dec (the roles that claim registers)", 0, split),
        ("after setmaxnreg.dec (the role that releases them)", split, len(code))]
    total = sum(number(r[samples]) for r in code) or 1.0
    print(f"{len(code)} SASS instructions, {total:.0f} warp-stall samples")
    for name, begin, end in roles:
        part = code[begin:end]
        role_total = sum(number(r[samples]) for r in part) or 1.0
        mix = stall_mix(part, reasons)
        mix_total = sum(mix.values()) or 1.0
        print(f"\n== {name}: instructions {begin}..{end - 1}, "
              f"{100 * role_total / total:.1f}% of the samples")
        print("   stall mix: " + ", ".join(f"{k} {100 * v / mix_total:.1f}%"
                                          for k, v in mix.most_common(8)))
        ranked = sorted(range(begin, end), key=lambda k: -number(code[k][samples]))[:top_n]
        print(f"   {'index':>5} {'share':>6}  {'instruction':58s} reasons")
        for k in ranked:
            r = code[k]
            why = sorted(((number(r[i]), reason) for i, reason in reasons), reverse=True)
            listed = ", ".join(f"{reason} {v:.0f}" for v, reason in why[:3] if v > 0)
            unlisted = number(r[samples]) - sum(v for v, _ in why)
            if unlisted > 0.5 * number(r[samples]):
                listed += f"{', ' if listed else ''}(unlisted {unlisted:.0f})"
            print(f"   {k:5d} {100 * number(r[samples]) / role_total:5.1f}%  "
                  f"{r[source].strip()[:58]:58s} {listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
