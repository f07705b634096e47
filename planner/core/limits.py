"""Bounds on the sizes a user may give: far past any real job, and small enough that every
formula stays finite and exact in its int64 or float64 columns (and in a JSON document).

Plain numbers, no imports: the input models (planner/core/spec.py, planner/io/jobfile.py) and
the command-line options (planner/cli/commands/_options.py, read by `--help` without pydantic)
both take their bounds from here. The model's other sizes are bounded on `ModelSpec`'s fields
(hidden <= 1M, MLP width <= 10M, vocabulary <= 1e8, ...). tests/test_integer_safety.py
and tests/test_hostile_inputs.py give each bound its reason.
"""

MAX_RANKS = 2**40
"""Most ranks a layout may span (tp·cp·pp·dp; also the bound of ep and dp_shard): past the
largest cluster a profile can describe (1,000,000 nodes of up to 100,000 GPUs, about 2^36.5), and
small enough that the rule table's int64 products of layout fields cannot wrap."""

MAX_SEQUENCES = 2**30
"""Most sequences in a global batch, a micro-batch, a step's micro-batches or micro_batch·
grad_accum·dp: some 1e9, past any run (GPT-3 used 1,536 sequences of 2,048 tokens; Llama 3 405B
16M tokens per step), and small enough that the tokens of a step (times a sequence of at most 1e8
tokens) stay below 2^57 in the int64 columns. Unbounded, a batch product could wrap and even pass
the batch rule: (2^63 - 1)^2 is 1 modulo 2^64, so micro_batch = grad_accum = 2^63 - 1 matched a
global batch of 1 and gave a negative step time."""

MAX_SEQ_LEN = 100_000_000
"""Most tokens per sequence: a model's max_seq_len and a run's seq_len."""

MAX_LAYERS = 100_000
"""Most transformer blocks: a model's num_layers and every layer count a layout names (virtual
stages, uneven first and last stages, recompute segments)."""

MAX_MEMORY_GIB = 1e9
"""Most GiB one memory figure may state (a GPU's memory, a node's host RAM, a runtime reserve):
1e9 GiB is about an exbibyte, and its bytes (x 2^30) stay below 2^63. A reserve of 1e18 GiB
ended the plan with an internal error (an int64 overflow), 1e300 GiB with an infinity."""

MAX_NVME_TB = 1e6
"""Most NVMe terabytes per node: 1e18 bytes, below 2^63."""

MAX_TOKENS = 1e18
"""Most training tokens of a run: some 25,000 times the largest published runs (~4e13), and small
enough that 6·N·D and the days stay finite (1e300 tokens wrote `Infinity` into `--json`)."""

MIN_EFFICIENCY = 1e-6
"""Least fraction of peak FLOP/s a run may be given (`--efficiency`, a GPU profile's
achieved_efficiency, a calibration entry): a millionth. Not higher: `zplan calibrate` on a CPU
inverts its measured step against a GPU profile's peak and writes entries near 1e-3 and below
(tests/test_calibrate.py); 0 or 1e-300 made the step time infinite."""

MIN_RATE_GB_PER_S = 1e-3
"""Least bandwidth a hardware profile may state (HBM, NVLink / PCIe, network, NVMe when present,
a measured collective), GB/s: 1 MB/s, far below any real link. 1e-300 GB/s made a time infinite
(and `--json` then refused to write it)."""

MAX_LATENCY_US = 1e9
"""Most microseconds a latency or per-call overhead may state: 1,000 s per message."""

MIN_PEAK_TFLOPS = 1e-6
"""Least peak throughput a GPU profile may state per dtype, TFLOP/s (1 MFLOP/s)."""

MIN_PARAMS_PER_S = 1.0
"""Least host optimizer throughput a node profile may state, parameters per second."""

MAX_PARAMS = 1e18
"""Most parameters `zplan budget --params` may name: some 500,000 times the largest published
models (~2e12); at least 1. 1e300 (or 1e-300) parameters made the scaling law's terms infinite
and `--json` refused to write them."""

MAX_DAYS = 1e6
"""Most days a `zplan budget` may span (some 2,700 years)."""

MAX_GPU_HOURS = 1e15
"""Most GPU-hours a `zplan budget` may name (a million GPUs for a hundred thousand years)."""

MAX_BUCKET_ELEMENTS = 2**50
"""Most elements (or bytes) an engine bucket or threshold may name (DeepSpeed's reduce / allgather
/ prefetch buckets, max live parameters, the persistence threshold; DDP's bucket bytes): some 1e15,
past any model's parameters, and x 8 bytes still below 2^63. DeepSpeed's `reduce_bucket_size:
1e300` crashed the plan (exit 3)."""
