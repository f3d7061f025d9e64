#!/usr/bin/env python3
"""Compare the SASS of two builds' CUDA objects, kernel by kernel.

    scripts/sass-diff.py OLD_BUILD_DIR NEW_BUILD_DIR

Each build's fc_cuda_kernels objects are disassembled (cuobjdump -sass) and
split into (architecture, kernel) -> instruction words, so code that moved
between files or changed instantiation order still compares equal. A
refactor proves itself here: prints the kernels that differ or exist on one
side only, and exits 1 if any do.
"""
import glob, os, re, subprocess, sys


def kernels(build):
    objs = sorted(glob.glob(os.path.join(build, "CMakeFiles", "fc_cuda_kernels.dir", "**", "*.cu.o"),
                        recursive=True))
    if not objs:
        sys.exit(f"no CUDA objects under {build}")
    out = {}
    for obj in objs:
        text = subprocess.run(["cuobjdump", "-sass", obj], check=True, capture_output=True, text=True).stdout
        arch, fn = None, None
        for line in text.splitlines():
            m = re.match(r"\s*code for (sm_\w+)", line)
            if m:
                arch, fn = m.group(1), None
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                fn = (arch, m.group(1))
                out.setdefault(fn, [])
                continue
            if fn is not None:
                words = re.findall(r"/\* (0x[0-9a-f]{16}) \*/", line)
                out[fn].extend(words)
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = kernels(sys.argv[1]), kernels(sys.argv[2])
    # Only architectures both builds compiled (one may be limited by ARCHS).
    archs = {a for a, _ in old} & {a for a, _ in new}
    old = {k: v for k, v in old.items() if k[0] in archs}
    new = {k: v for k, v in new.items() if k[0] in archs}
    bad = 0
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new:
            print(f"only in {'new' if key in new else 'old'}: {key[0]} {key[1]}")
            bad += 1
        elif old[key] != new[key]:
            print(f"differs ({len(old[key])} -> {len(new[key])} words): {key[0]} {key[1]}")
            bad += 1
    print(f"{len(set(old) | set(new))} kernels compared ({', '.join(sorted(archs))}), {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
