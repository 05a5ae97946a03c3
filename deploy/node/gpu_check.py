"""What vLLM does first on the GPU, one line per check (run by vLLM's venv Python; exit 1 on a failure).

``import vllm``; an fp16 and a bf16 matrix product on the device (cuBLAS GEMMs: the call that fails
with CUBLAS_STATUS_INVALID_VALUE when torch and its CUDA libraries disagree, pytorch/pytorch#174949);
the device's compute capability against the architectures the locked torch was built for
(``torch.cuda.get_arch_list()``: an ``sm_XY`` of the same major and a minor not above the device's,
or PTX of an older one). The deploy asks it every run (deploy/facts.py CudaDevice); scripts/gpu-check
prints it for a person on the node.
"""

import sys


def main() -> int:
    failed = False

    def check(what, run):
        nonlocal failed
        try:
            print(f"ok   {what}: {run()}", flush=True)
        except Exception as error:  # every failure is a line, never a traceback
            failed = True
            first = (str(error).splitlines() or [""])[0]
            print(f"FAIL {what}: {type(error).__name__}: {first}", flush=True)

    def imports():
        import vllm

        return f"vllm {vllm.__version__}"

    check("import vllm", imports)
    try:
        import torch
    except ImportError as error:
        print(f"FAIL import torch: {error}", flush=True)
        return 1

    def matmul(dtype):
        a = torch.randn(256, 512, device="cuda", dtype=dtype)
        b = torch.randn(512, 128, device="cuda", dtype=dtype)
        c = a @ b
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = float((c.float() - ref).abs().max() / ref.abs().max())
        if err > 0.05:
            raise ValueError(f"relative error {err:.3g}")
        device = torch.cuda.get_device_name(0)
        return f"{device}, torch {torch.__version__} (CUDA {torch.version.cuda}), error {err:.1e}"

    check("fp16 matmul", lambda: matmul(torch.float16))
    check("bf16 matmul", lambda: matmul(torch.bfloat16))

    def capability():
        major, minor = torch.cuda.get_device_capability(0)
        archs = torch.cuda.get_arch_list()
        sass = [a for a in archs if a.startswith(f"sm_{major}") and len(a) == 5 and int(a[4]) <= minor]
        ptx = [a for a in archs if a.startswith("compute_") and int(a[8:]) <= major * 10 + minor]
        if not (sass or ptx):
            raise ValueError(f"sm_{major}{minor} is not among the lock's torch architectures {' '.join(archs)}")
        return f"sm_{major}{minor} runs {(sass or ptx)[-1]} of {' '.join(archs)}"

    check("device capability", capability)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
