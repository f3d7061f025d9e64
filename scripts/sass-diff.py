#!/usr/bin/env python3
"""Compare the SASS of two builds' CUDA objects, kernel by kernel.

    scripts/sass-diff.py OLD_BUILD_DIR NEW_BUILD_DIR

Each build's fc_cuda_kernels objects are disassembled (cuobjdump -sass,
from the CUDA toolkit or `pip install nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm`, with nvdisasm on PATH; $CUOBJDUMP names it) and split
into (architecture, kernel) -> instruction words, so code that moved
between files or changed instantiation order still compares equal. A
refactor proves itself here: prints the kernels that differ or exist on one
side only, and exits 1 if any do.
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


def kernels(build):
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
