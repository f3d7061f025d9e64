#!/usr/bin/env python3
"""Compare the SASS of two builds' CUDA objects, kernel by kernel.

    scripts/sass-diff.py [--mask-params] OLD_BUILD_DIR NEW_BUILD_DIR

Each build's fc_cuda_kernels objects are disassembled (cuobjdump -sass,
from the CUDA toolkit or `pip install nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, with nvdisasm on PATH; $CUOBJDUMP names it) and split
into (architecture, kernel) -> instruction words, so code that moved
between files or changed instantiation order still compares equal. A
refactor proves itself here: prints the kernels that differ or exist on one
side only, and exits 1 if any do.

--mask-params compares the instruction text with every kernel-parameter
offset (c[0x0][...]) masked: for a change that only grows or reorders the
parameter structs, the code must still be the same instruction for
instruction.
"""
import glob, os, re, shutil, subprocess, sys


def cuobjdump():
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        cands = glob.glob(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"))
        cands += glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "*", "bin",
                                        "cuobjdump"))
        found = cands[0] if cands else None
    if not found:
        sys.exit("no cuobjdump: install the CUDA toolkit's, or pip install nvidia-cuda-cuobjdump, or set CUOBJDUMP")
    return found


# Anonymous-namespace names carry a hash of the source path: one source
# built in two checkouts must still compare equal.
def plain_name(name):
    return re.sub(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_[0-9a-f]{8}", r"_GLOBAL__N__\1", name)


PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def kernels(build, mask_params=False):
    objs = sorted(glob.glob(os.path.join(build, "CMakeFiles", "fc_cuda_kernels.dir", "**", "*.cu.o"),
                        recursive=True))
    if not objs:
        sys.exit(f"no CUDA objects under {build}")
    out, tool = {}, cuobjdump()
    for obj in objs:
        text = subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True).stdout
        arch, fn = None, None
        for line in text.splitlines():
            m = re.match(r"\s*code for (sm_\w+)", line)
            if m:
                arch, fn = m.group(1), None
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                fn = (arch, plain_name(m.group(1)))
                out.setdefault(fn, [])
                continue
            if fn is not None and mask_params:
                m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;", line)
                if m:
                    out[fn].append(PARAM.sub("c[0x0][P]", m.group(1)))
            elif fn is not None:
                words = re.findall(r"/\* (0x[0-9a-f]{16}) \*/", line)
                out[fn].extend(words)
    return out


def main():
    args = [a for a in sys.argv[1:] if a != "--mask-params"]
    mask = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    old, new = kernels(args[0], mask), kernels(args[1], mask)
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
            print(f"differs ({len(old[key])} -> {len(new[key])} {'instructions' if mask else 'words'}): "
                  f"{key[0]} {key[1]}")
            bad += 1
    print(f"{len(set(old) | set(new))} kernels compared ({', '.join(sorted(archs))}), {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
