#!/usr/bin/env python3
"""Fails when a moekit function in a built x86-64 binary can return with the upper halves of the
vector registers dirty (a 256/512-bit instruction since the last vzeroupper on some path to a ret).

Why: moekit's kernels are compiled for AVX2/AVX-512 with target attributes and called from code
compiled for generic x86-64, whose floating point is SSE-encoded. On Intel cores every SSE
instruction that runs while the upper state is dirty stalls (bench/RESULTS.md, "The SSE/AVX
transition"). GCC compiles a function that takes vectors by value to return without vzeroupper,
and its callers, which assume every call returns clean, then return dirty too.

    scripts/check_vzeroupper.py BINARY [BINARY ...]

Reads `objdump -d` of each binary; for every function in namespace moekit (demangled),
a forward pass over its control flow (direct jumps and fall-through; an indirect jump ends the
path) marks each instruction clean or dirty: a ymm/zmm operand makes it dirty, vzeroupper or
vzeroall clean, a call returns the callee's exit state (dirty for a function this check reports,
clean otherwise, as the ABI says). Exit status 1 when any function returns dirty by its own
instructions (each is named, with its rets; the callers that inherit it are counted).
"""
import re
import subprocess
import sys

FUNC = re.compile(r"^([0-9a-f]+) <(.+)>:$")
INSN = re.compile(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$")
TARGET = re.compile(r"^([0-9a-f]+) <")
WIDE = re.compile(r"%[yz]mm\d+")


def functions(binary):
    """Yields (name, [(address, mnemonic, operands)]) for each moekit function."""
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", binary], check=True,
                         capture_output=True, text=True).stdout
    name, body = None, []
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            if name:
                yield name, body
            # Demangled: "float moekit::f<4u>(...)"; templates' return types come first.
            name, body = (m.group(2) if "moekit::" in m.group(2).split("(")[0] else None), []
        elif name:
            i = INSN.match(line)
            if i:
                body.append((int(i.group(1), 16), i.group(2), i.group(3)))
    if name:
        yield name, body


def dirty_rets(body, dirty_exit):
    """Addresses of the rets of `body` some path reaches with dirty upper state."""
    index = {a: k for k, (a, _, _) in enumerate(body)}
    state = {}  # instruction index -> dirty on entry (True wins)
    work = [(0, False)]
    bad = set()
    while work:
        k, dirty = work.pop()
        while k < len(body):
            if state.get(k) is True or (k in state and not dirty):
                break
            state[k] = dirty
            addr, op, args = body[k]
            if op in ("vzeroupper", "vzeroall"):
                dirty = False
            elif op.startswith("call"):
                t = TARGET.match(args)
                callee = args.split("<", 1)[1].rstrip(">") if "<" in args else ""
                dirty = bool(t) and dirty_exit(re.sub(r"\+0x[0-9a-f]+$", "", callee))
            elif WIDE.search(args):
                dirty = True
            if op.startswith("ret"):
                if dirty:
                    bad.add(addr)
                break
            if op.startswith("j"):
                t = TARGET.match(args)
                if t and int(t.group(1), 16) in index:
                    work.append((index[int(t.group(1), 16)], dirty))
                if op.startswith("jmp"):
                    break  # unconditional (or indirect: the path ends)
            k += 1
    return sorted(bad)


def main(binaries):
    failed = 0
    for binary in binaries:
        bodies = dict(functions(binary))
        # Where the dirty state comes from: functions that return it by their own instructions,
        # with every call taken to return clean. Their callers inherit it.
        origins = {n: bad for n, b in bodies.items() if (bad := dirty_rets(b, lambda c: False))}
        reported = dict(origins)
        changed = True
        while changed:
            changed = False
            for name, body in bodies.items():
                if name not in reported and (bad := dirty_rets(body, reported.__contains__)):
                    reported[name] = bad
                    changed = True
        print(f"check_vzeroupper: {binary}: {len(bodies)} moekit functions, {len(origins)} "
              f"return dirty upper vector state, {len(reported) - len(origins)} more through "
              "calls to them")
        for name, bad in sorted(origins.items()):
            print(f"  {name}: ret at {', '.join(hex(a) for a in bad)} (no vzeroupper on the way)",
                  file=sys.stderr)
        failed += len(origins)
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
