import os, sys, shutil
from pathlib import Path
from harness import sandbox
root = Path(sys.argv[1]); art = root / "art.bin"
job = sandbox.prepare_job(root, "bench", True, None, root / "tri-empty", {"TORCHINDUCTOR_CACHE_DIR": root / "ind-unused"})
tri = job.scratch / "peers-tri"; sandbox.copy_triton_cache(root / "triA", tri)
shutil.copyfile(art, job.job_dir / "art.bin"); os.chmod(job.job_dir / "art.bin", 0o644)
drop = sandbox.drop_target(); print("drop", drop, flush=True)
req = {"scratch": str(job.scratch), "report_path": str(job.report_path), "drop": list(drop) if isinstance(drop, tuple) else None,
       "drop_reason": None, "art": str(job.job_dir / "art.bin"), "tri": str(tri)}
r = sandbox.run_child(job, req, 200, "cuda", 4, module="reprochild")
print("rc", r.returncode, r.events)
print(job.log_path.read_text()[-12000:])
