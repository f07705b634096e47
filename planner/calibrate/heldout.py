"""The training configurations `zplan calibrate hardware` and benchmarks/calibrate_hardware.py
predict from the parts and then measure: held apart from the calibration (none of their times is
used to fit anything). GPT-2's architecture scaled down so a CPU step takes well under a second.

The sets, reported apart (each a table of rows; `configs` builds them):
- `SEEN_1`: the four configurations of the first runs, looked at while the
  predictor was being developed (2026-11-23).
- `SEEN_2`: the five configurations committed 2026-11-23 ~14:10 UTC
  before they were first run; their errors were reported and looked at in that session, so
  they are seen now too (in-sample for the predictor's *structure*, though nothing is fitted
  on their times).
- `SEEN_3`: fixed and committed 2026-11-23 ~17:10 UTC, before any
  prediction or measurement of them was run (model sizes 6 x 256, 5 x 320, 3 x 448, sequence
  lengths 96 and 192, micro-batch 3, FSDP2 with six blocks); their errors were reported and
  looked at in the next session (the lead's runs), so they are seen now too.
- `SEEN_4`: fixed and committed 2026-11-23 ~19:30 UTC, before any
  prediction or measurement of them was run (model sizes 8 x 192, 2 x 576, 4 x 288, 3 x 640,
  sequence lengths 64, 160 and 224, micro-batches 5 and 6); their errors were reported by the
  lead's three quiet runs (every row predicted low) and looked at, so they are seen now too.
- `SEEN_5`: fixed and committed 2026-11-23 ~22:45 UTC, before any
  prediction or measurement of them was run (3 x 352, 7 x 224, 4 x 416, 2 x 704, 1 x 512,
  sequence lengths 48, 112 and 320, micro-batches 7 and 10); reported by one loaded run and the
  lead's three quiet runs (FSDP2 and ZeRO-1 rows low by 20-39 %) and looked at, so seen now too.
- `SEEN_6`: fixed and committed 2026-11-24 ~01:45 UTC, before any
  prediction or measurement of them was run (3 x 480, 5 x 272, 2 x 608, 3 x 544, 6 x 160,
  2 x 800; sequence lengths 80, 144, 176, 240; micro-batch 9); reported by the lead's three
  quiet runs (every row low by 6-18 %) and looked at, so seen now too.
- `SEEN_7`: fixed and committed 2026-11-24 ~06:20 UTC, before any
  prediction or measurement of them was run (4 x 368, 6 x 240, 2 x 672, 3 x 496, 5 x 200,
  2 x 736; sequence lengths 200, 120, 72, 104, 272, 168); reported by the lead's three quiet
  runs with the predictor unchanged (FSDP2 rows -13 to -27 %) and looked at, so seen now too.
- `SEEN_8`: fixed and committed 2026-11-24 ~07:16 UTC, before any
  prediction or measurement of them was run and before that session's change to the
  FSDP2-as-called part (3 x 432, 5 x 336, 2 x 784, 3 x 592, 3 x 464, 2 x 656; sequence lengths
  152, 136, 88, 184, 216, 56); evaluated once by three quiet runs on 2026-11-28 (NEW 4.9-8.9 %
  mean, 8.1-18.0 % max) and looked at, so seen now too.
- `SEEN_9`: fixed and committed 2026-11-28 ~09:00 UTC, before any
  prediction or measurement of them was run, with the predictor of 5f601de unchanged
  (4 x 400, 5 x 304, 2 x 832, 3 x 528, 3 x 560, 6 x 176; sequence lengths 232, 208, 40, 248,
  264, 280); evaluated once by three quiet runs the same morning (NEW 8.6-11.7 % mean,
  12.9-18.2 % max) and looked at, so seen now too.
- `SEEN_10`: fixed and committed 2026-11-28 ~09:15 UTC, before any
  prediction or measurement of them was run and before that morning's change to the FSDP2 part
  (4 x 360, 6 x 280, 2 x 848, 3 x 624, 2 x 720, 6 x 208; sequence lengths 196, 244, 60, 140,
  100, 300); evaluated once by three quiet runs (NEW 9.0-11.5 % mean, 12.9-17.1 % max) and
  looked at, so seen now too.
- `SEEN_11`: fixed and committed 2026-11-28 ~10:00 UTC, before any
  prediction or measurement of them was run and before that morning's change to the
  memory-contention probe (3 x 440, 5 x 312, 2 x 816, 3 x 600, 2 x 680, 6 x 184; sequence
  lengths 212, 260, 52, 156, 108, 292); evaluated once by three quiet runs (NEW 9.9-12.5 %
  mean, 14.0-21.4 % max) and looked at, so seen now too.
- `SEEN_12`: fixed and committed 2026-11-28 ~11:04 UTC, before any
  prediction or measurement of them was run (4 x 376, 5 x 344, 2 x 872, 3 x 616, 2 x 696,
  6 x 216; sequence lengths 228, 188, 68, 164, 124, 284); evaluated once by three quiet runs with
  the predictor of 7aa408e unchanged (NEW 5.9-7.1 % mean, 8.2-10.6 % max) and looked at, so seen
  now too.
- `SEEN_13`: fixed and committed 2026-11-28 ~12:05 UTC, before any prediction or measurement
  of them was run (4 x 392, 5 x 328, 2 x 888, 3 x 632, 2 x 712, 6 x 232; sequence lengths 236,
  180, 76, 172, 116, 276); evaluated once by three quiet runs with the predictor of 0cdb06b (the
  fixed probe model's contention part; NEW 5.9-9.0 % mean, 15.2-19.9 % max) and looked at, so
  seen now too.
- `SEEN_14`: fixed and committed 2026-11-28 ~13:30 UTC, before any prediction or measurement
  of them was run (4 x 408, 5 x 296, 2 x 904, 3 x 648, 2 x 728, 6 x 248; sequence lengths 220,
  204, 84, 148, 132, 268); evaluated once by three quiet runs with the predictor of 634c07a (page
  faults as a part; NEW 4.1-8.4 % mean, 10.5-18.7 % max) and looked at, so seen now too.
- `SEEN_15`: fixed and committed 2026-11-28 ~16:06 UTC, before any prediction or measurement
  of them was run (4 x 424, 5 x 264, 2 x 920, 3 x 664, 2 x 744, 6 x 168; sequence lengths 252,
  288, 44, 296, 92, 304); evaluated once by three quiet runs with the predictor of 9b3a743 (FSDP2
  groups timed at their own parameter shapes; NEW 3.3-6.1 % mean, 5.7-15.4 % max) and looked at,
  so seen now too.
- `SEEN_16`: fixed and committed 2026-11-28 ~17:20 UTC, before any prediction or measurement
  of them was run (4 x 472, 5 x 456, 2 x 936, 3 x 568, 2 x 760, 6 x 152; sequence lengths 308,
  316, 36, 324, 328, 312); evaluated once by three quiet runs with the predictor of 0ac99e7 (the
  page-fault replay's mean over six processes; NEW 7.4-9.1 % mean, 17.4-24.2 % max) and looked
  at, so seen now too.
- `SEEN_17`: fixed and committed 2026-11-28 ~19:12 UTC, before any prediction or measurement
  of them was run (4 x 488, 5 x 520, 2 x 952, 3 x 584, 2 x 776, 6 x 144; sequence lengths 218,
  270, 32, 336, 162, 332); evaluated once by three quiet runs with the predictor of 716494f
  unchanged (NEW 2.0-4.7 % mean, 4.3-14.0 % max) and looked at, so seen now too.
- `SEEN_18`: fixed and committed 2026-11-28 ~19:55 UTC, before any prediction or measurement
  of them was run (4 x 504, 5 x 536, 2 x 944, 3 x 552, 2 x 792, 6 x 136; sequence lengths 242,
  194, 28, 306, 138, 340); evaluated once by three quiet runs with the predictor of 7d1754c
  (unchanged since 0ac99e7; NEW 1.0-3.8 % mean, 2.3-8.1 % max) and looked at, so seen now too.
- `SEEN_19`: fixed and committed 2026-11-28 ~21:15 UTC, before any prediction or measurement
  of them was run (3 x 688, 3 x 752, 2 x 960, 2 x 824, 2 x 840, 6 x 128; sequence lengths 246,
  198, 24, 302, 146, 344); evaluated once by three quiet runs with the predictor of 9625fb2
  (unchanged since 0ac99e7; NEW 2.5-4.1 % mean, 2.9-10.2 % max) and looked at, so seen now too.
- `SEEN_20`: fixed and committed 2026-11-28 ~21:36 UTC, before any prediction or measurement
  of them was run (2 x 864, 3 x 808, 2 x 968, 2 x 880, 2 x 896, 6 x 120; sequence lengths 274,
  166, 20, 346, 134, 348); evaluated once by three quiet runs with the predictor of 0d8f810
  (unchanged since 0ac99e7; NEW 2.7-4.0 % mean, 6.5-7.8 % max) and looked at, so seen now too.
- `NEW`: fixed and committed 2026-11-28 ~22:00 UTC, before any prediction or measurement of them
  was run and before any change it will evaluate: model widths used by no earlier set (2 x 912,
  3 x 856, 2 x 976, 2 x 928, 2 x 984, 6 x 112), sequence lengths none used before (278, 170,
  16, 350, 130, 352), micro-batches 2-8, every engine (single, DDP, FSDP2 twice, ZeRO-1 twice).
  The process counts stay 1 and 2: the machine has 2 cores, a third rank would share a core and
  time the scheduler. Their errors are the out-of-sample figure; nothing in the predictor may be
  changed after looking at them (changes go into a new set).
"""

from __future__ import annotations

from planner.calibrate.config import scaled_model
from planner.calibrate.predict import StepConfig, Strategy
from planner.core.spec import ModelSpec

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 2048}
LARGE = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 4096}
MID = {"layers": 3, "hidden": 384, "heads": 6, "ffn": 1536, "vocab": 3072}
WIDE = {"layers": 2, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 2048}
DEEP = {"layers": 6, "hidden": 256, "heads": 4, "ffn": 1024, "vocab": 2048}
NARROW = {"layers": 5, "hidden": 320, "heads": 5, "ffn": 1280, "vocab": 2560}
H448 = {"layers": 3, "hidden": 448, "heads": 7, "ffn": 1792, "vocab": 3584}
SLIM = {"layers": 8, "hidden": 192, "heads": 3, "ffn": 768, "vocab": 1536}
H576 = {"layers": 2, "hidden": 576, "heads": 9, "ffn": 2304, "vocab": 2304}
H288 = {"layers": 4, "hidden": 288, "heads": 6, "ffn": 1152, "vocab": 2816}
H640 = {"layers": 3, "hidden": 640, "heads": 10, "ffn": 2560, "vocab": 1792}
H352 = {"layers": 3, "hidden": 352, "heads": 11, "ffn": 1408, "vocab": 2432}
H224 = {"layers": 7, "hidden": 224, "heads": 7, "ffn": 896, "vocab": 1280}
H416 = {"layers": 4, "hidden": 416, "heads": 13, "ffn": 1664, "vocab": 3328}
H704 = {"layers": 2, "hidden": 704, "heads": 11, "ffn": 2816, "vocab": 1024}
ONE512 = {"layers": 1, "hidden": 512, "heads": 16, "ffn": 2048, "vocab": 3840}
H480 = {"layers": 3, "hidden": 480, "heads": 8, "ffn": 1920, "vocab": 2944}
H272 = {"layers": 5, "hidden": 272, "heads": 8, "ffn": 1088, "vocab": 2176}
H608 = {"layers": 2, "hidden": 608, "heads": 8, "ffn": 2432, "vocab": 1664}
H544 = {"layers": 3, "hidden": 544, "heads": 8, "ffn": 2176, "vocab": 2048}
H160 = {"layers": 6, "hidden": 160, "heads": 5, "ffn": 640, "vocab": 1152}
H800 = {"layers": 2, "hidden": 800, "heads": 10, "ffn": 3200, "vocab": 1024}
H368 = {"layers": 4, "hidden": 368, "heads": 8, "ffn": 1472, "vocab": 2304}
H240 = {"layers": 6, "hidden": 240, "heads": 6, "ffn": 960, "vocab": 1792}
H672 = {"layers": 2, "hidden": 672, "heads": 12, "ffn": 2688, "vocab": 1408}
H496 = {"layers": 3, "hidden": 496, "heads": 8, "ffn": 1984, "vocab": 2688}
H200 = {"layers": 5, "hidden": 200, "heads": 5, "ffn": 800, "vocab": 1600}
H736 = {"layers": 2, "hidden": 736, "heads": 8, "ffn": 2944, "vocab": 1152}
H432 = {"layers": 3, "hidden": 432, "heads": 8, "ffn": 1728, "vocab": 2560}
H336 = {"layers": 5, "hidden": 336, "heads": 8, "ffn": 1344, "vocab": 1920}
H784 = {"layers": 2, "hidden": 784, "heads": 8, "ffn": 3136, "vocab": 1216}
H592 = {"layers": 3, "hidden": 592, "heads": 8, "ffn": 2368, "vocab": 1536}
H464 = {"layers": 3, "hidden": 464, "heads": 8, "ffn": 1856, "vocab": 2112}
H656 = {"layers": 2, "hidden": 656, "heads": 8, "ffn": 2624, "vocab": 1344}
H400 = {"layers": 4, "hidden": 400, "heads": 8, "ffn": 1600, "vocab": 2304}
H304 = {"layers": 5, "hidden": 304, "heads": 8, "ffn": 1216, "vocab": 2816}
H832 = {"layers": 2, "hidden": 832, "heads": 8, "ffn": 3328, "vocab": 2048}
H528 = {"layers": 3, "hidden": 528, "heads": 8, "ffn": 2112, "vocab": 3328}
H560 = {"layers": 3, "hidden": 560, "heads": 8, "ffn": 2240, "vocab": 2560}
H176 = {"layers": 6, "hidden": 176, "heads": 8, "ffn": 704, "vocab": 1792}
H360 = {"layers": 4, "hidden": 360, "heads": 8, "ffn": 1440, "vocab": 2176}
H280 = {"layers": 6, "hidden": 280, "heads": 8, "ffn": 1120, "vocab": 2688}
H848 = {"layers": 2, "hidden": 848, "heads": 8, "ffn": 3392, "vocab": 1408}
H624 = {"layers": 3, "hidden": 624, "heads": 8, "ffn": 2496, "vocab": 3200}
H720 = {"layers": 2, "hidden": 720, "heads": 8, "ffn": 2880, "vocab": 2944}
H208 = {"layers": 6, "hidden": 208, "heads": 8, "ffn": 832, "vocab": 1664}
H440 = {"layers": 3, "hidden": 440, "heads": 8, "ffn": 1760, "vocab": 2624}
H312 = {"layers": 5, "hidden": 312, "heads": 8, "ffn": 1248, "vocab": 1856}
H816 = {"layers": 2, "hidden": 816, "heads": 8, "ffn": 3264, "vocab": 1472}
H600 = {"layers": 3, "hidden": 600, "heads": 8, "ffn": 2400, "vocab": 2240}
H680 = {"layers": 2, "hidden": 680, "heads": 8, "ffn": 2720, "vocab": 3008}
H184 = {"layers": 6, "hidden": 184, "heads": 8, "ffn": 736, "vocab": 1600}
H376 = {"layers": 4, "hidden": 376, "heads": 8, "ffn": 1504, "vocab": 2368}
H344 = {"layers": 5, "hidden": 344, "heads": 8, "ffn": 1376, "vocab": 2752}
H872 = {"layers": 2, "hidden": 872, "heads": 8, "ffn": 3488, "vocab": 1344}
H616 = {"layers": 3, "hidden": 616, "heads": 8, "ffn": 2464, "vocab": 2496}
H696 = {"layers": 2, "hidden": 696, "heads": 8, "ffn": 2784, "vocab": 3072}
H216 = {"layers": 6, "hidden": 216, "heads": 8, "ffn": 864, "vocab": 1728}
H392 = {"layers": 4, "hidden": 392, "heads": 8, "ffn": 1568, "vocab": 2432}
H328 = {"layers": 5, "hidden": 328, "heads": 8, "ffn": 1312, "vocab": 2624}
H888 = {"layers": 2, "hidden": 888, "heads": 8, "ffn": 3552, "vocab": 1280}
H632 = {"layers": 3, "hidden": 632, "heads": 8, "ffn": 2528, "vocab": 2176}
H712 = {"layers": 2, "hidden": 712, "heads": 8, "ffn": 2848, "vocab": 2944}
H232 = {"layers": 6, "hidden": 232, "heads": 8, "ffn": 928, "vocab": 1856}
H408 = {"layers": 4, "hidden": 408, "heads": 8, "ffn": 1632, "vocab": 2240}
H296 = {"layers": 5, "hidden": 296, "heads": 8, "ffn": 1184, "vocab": 2496}
H904 = {"layers": 2, "hidden": 904, "heads": 8, "ffn": 3616, "vocab": 1152}
H648 = {"layers": 3, "hidden": 648, "heads": 8, "ffn": 2592, "vocab": 2048}
H728 = {"layers": 2, "hidden": 728, "heads": 8, "ffn": 2912, "vocab": 2880}
H248 = {"layers": 6, "hidden": 248, "heads": 8, "ffn": 992, "vocab": 1920}
H424 = {"layers": 4, "hidden": 424, "heads": 8, "ffn": 1696, "vocab": 2368}
H264 = {"layers": 5, "hidden": 264, "heads": 8, "ffn": 1056, "vocab": 2240}
H920 = {"layers": 2, "hidden": 920, "heads": 8, "ffn": 3680, "vocab": 1088}
H664 = {"layers": 3, "hidden": 664, "heads": 8, "ffn": 2656, "vocab": 2112}
H744 = {"layers": 2, "hidden": 744, "heads": 8, "ffn": 2976, "vocab": 2816}
H168 = {"layers": 6, "hidden": 168, "heads": 8, "ffn": 672, "vocab": 1984}
H472 = {"layers": 4, "hidden": 472, "heads": 8, "ffn": 1888, "vocab": 2176}
H456 = {"layers": 5, "hidden": 456, "heads": 8, "ffn": 1824, "vocab": 2048}
H936 = {"layers": 2, "hidden": 936, "heads": 8, "ffn": 3744, "vocab": 1216}
H568 = {"layers": 3, "hidden": 568, "heads": 8, "ffn": 2272, "vocab": 2496}
H760 = {"layers": 2, "hidden": 760, "heads": 8, "ffn": 3040, "vocab": 2752}
H152 = {"layers": 6, "hidden": 152, "heads": 8, "ffn": 608, "vocab": 1856}
H488 = {"layers": 4, "hidden": 488, "heads": 8, "ffn": 1952, "vocab": 2304}
H520 = {"layers": 5, "hidden": 520, "heads": 8, "ffn": 2080, "vocab": 1920}
H952 = {"layers": 2, "hidden": 952, "heads": 8, "ffn": 3808, "vocab": 1088}
H584 = {"layers": 3, "hidden": 584, "heads": 8, "ffn": 2336, "vocab": 2624}
H776 = {"layers": 2, "hidden": 776, "heads": 8, "ffn": 3104, "vocab": 2560}
H144 = {"layers": 6, "hidden": 144, "heads": 8, "ffn": 576, "vocab": 1728}
H504 = {"layers": 4, "hidden": 504, "heads": 8, "ffn": 2016, "vocab": 2112}
H536 = {"layers": 5, "hidden": 536, "heads": 8, "ffn": 2144, "vocab": 1792}
H944 = {"layers": 2, "hidden": 944, "heads": 8, "ffn": 3776, "vocab": 1152}
H552 = {"layers": 3, "hidden": 552, "heads": 8, "ffn": 2208, "vocab": 2688}
H792 = {"layers": 2, "hidden": 792, "heads": 8, "ffn": 3168, "vocab": 2432}
H136 = {"layers": 6, "hidden": 136, "heads": 8, "ffn": 544, "vocab": 1664}
H688 = {"layers": 3, "hidden": 688, "heads": 8, "ffn": 2752, "vocab": 2176}
H752 = {"layers": 3, "hidden": 752, "heads": 8, "ffn": 3008, "vocab": 1920}
H960 = {"layers": 2, "hidden": 960, "heads": 8, "ffn": 3840, "vocab": 1216}
H824 = {"layers": 2, "hidden": 824, "heads": 8, "ffn": 3296, "vocab": 2560}
H840 = {"layers": 2, "hidden": 840, "heads": 8, "ffn": 3360, "vocab": 2304}
H128 = {"layers": 6, "hidden": 128, "heads": 8, "ffn": 512, "vocab": 1600}
H864 = {"layers": 2, "hidden": 864, "heads": 8, "ffn": 3456, "vocab": 1984}
H808 = {"layers": 3, "hidden": 808, "heads": 8, "ffn": 3232, "vocab": 2240}
H968 = {"layers": 2, "hidden": 968, "heads": 8, "ffn": 3872, "vocab": 1344}
H880 = {"layers": 2, "hidden": 880, "heads": 8, "ffn": 3520, "vocab": 2496}
H896 = {"layers": 2, "hidden": 896, "heads": 8, "ffn": 3584, "vocab": 2112}
H120 = {"layers": 6, "hidden": 120, "heads": 8, "ffn": 480, "vocab": 1472}
H912 = {"layers": 2, "hidden": 912, "heads": 8, "ffn": 3648, "vocab": 2048}
H856 = {"layers": 3, "hidden": 856, "heads": 8, "ffn": 3424, "vocab": 1856}
H976 = {"layers": 2, "hidden": 976, "heads": 8, "ffn": 3904, "vocab": 1408}
H928 = {"layers": 2, "hidden": 928, "heads": 8, "ffn": 3712, "vocab": 2624}
H984 = {"layers": 2, "hidden": 984, "heads": 8, "ffn": 3936, "vocab": 2176}
H112 = {"layers": 6, "hidden": 112, "heads": 8, "ffn": 448, "vocab": 1536}


Row = tuple[str, dict[str, int], int, int, Strategy]
"""(label, model shape, sequence length, micro-batch, strategy) of one configuration (`configs`)."""

SEEN_1: tuple[Row, ...] = (
    ("small b4", SMALL, 128, 4, "single"),
    ("large b2 DDP", LARGE, 128, 2, "ddp"),
    ("large b1 FSDP2", LARGE, 128, 1, "fsdp2"),
    ("small b8 ZeRO-1", SMALL, 128, 8, "zero1"),
)
"""SEEN-1: four configurations; with nproc = 1 the distributed ones run on one process (no collective)."""

SEEN_2: tuple[Row, ...] = (
    ("mid s256 b2", MID, 256, 2, "single"),
    ("mid b4 DDP", MID, 128, 4, "ddp"),
    ("mid b2 FSDP2", MID, 128, 2, "fsdp2"),
    ("wide b1 ZeRO-1", WIDE, 128, 1, "zero1"),
    ("wide s256 b1 DDP", WIDE, 256, 1, "ddp"),
)
"""SEEN-2: the previous session's held-out five (reported there, so seen now)."""

SEEN_3: tuple[Row, ...] = (
    ("narrow s192 b3", NARROW, 192, 3, "single"),
    ("deep b4 FSDP2", DEEP, 128, 4, "fsdp2"),
    ("narrow b3 ZeRO-1", NARROW, 128, 3, "zero1"),
    ("h448 s96 b3 DDP", H448, 96, 3, "ddp"),
    ("h448 b1 FSDP2", H448, 128, 1, "fsdp2"),
)
"""SEEN-3: the held-out five committed ~17:10 UTC (reported by the lead since, so seen now)."""

SEEN_4: tuple[Row, ...] = (
    ("slim s160 b5", SLIM, 160, 5, "single"),
    ("h576 s64 b5 DDP", H576, 64, 5, "ddp"),
    ("h288 s224 b2 FSDP2", H288, 224, 2, "fsdp2"),
    ("h640 s64 b6 ZeRO-1", H640, 64, 6, "zero1"),
)
"""SEEN-4: the held-out four committed ~19:30 UTC (run three times by the lead since, so seen now)."""

SEEN_5: tuple[Row, ...] = (
    ("h352 s320 b1", H352, 320, 1, "single"),
    ("one512 s112 b7", ONE512, 112, 7, "single"),
    ("h224 s112 b7 DDP", H224, 112, 7, "ddp"),
    ("h416 s48 b10 FSDP2", H416, 48, 10, "fsdp2"),
    ("h704 s112 b2 ZeRO-1", H704, 112, 2, "zero1"),
)
"""SEEN-5: the held-out five committed 2026-11-23 ~22:45 UTC (run four times since, so seen now)."""

SEEN_6: tuple[Row, ...] = (
    ("h480 s144 b2", H480, 144, 2, "single"),
    ("h272 s176 b3 DDP", H272, 176, 3, "ddp"),
    ("h608 s80 b4 FSDP2", H608, 80, 4, "fsdp2"),
    ("h544 s144 b2 FSDP2", H544, 144, 2, "fsdp2"),
    ("h160 s240 b9 ZeRO-1", H160, 240, 9, "zero1"),
    ("h800 s64 b2 ZeRO-1", H800, 64, 2, "zero1"),
)
"""SEEN-6: the held-out six committed 2026-11-24 ~01:45 UTC (run three times by the lead since, so seen now)."""

SEEN_7: tuple[Row, ...] = (
    ("h368 s200 b2", H368, 200, 2, "single"),
    ("h240 s120 b5 DDP", H240, 120, 5, "ddp"),
    ("h672 s72 b3 FSDP2", H672, 72, 3, "fsdp2"),
    ("h736 s168 b1 FSDP2", H736, 168, 1, "fsdp2"),
    ("h496 s104 b4 ZeRO-1", H496, 104, 4, "zero1"),
    ("h200 s272 b6 ZeRO-1", H200, 272, 6, "zero1"),
)
"""SEEN-7: the held-out six committed 2026-11-24 ~06:20 UTC (run three times by the lead since, so seen now)."""

SEEN_8: tuple[Row, ...] = (
    ("h432 s152 b3", H432, 152, 3, "single"),
    ("h336 s136 b4 DDP", H336, 136, 4, "ddp"),
    ("h784 s88 b2 FSDP2", H784, 88, 2, "fsdp2"),
    ("h592 s184 b1 FSDP2", H592, 184, 1, "fsdp2"),
    ("h464 s216 b2 ZeRO-1", H464, 216, 2, "zero1"),
    ("h656 s56 b5 ZeRO-1", H656, 56, 5, "zero1"),
)
"""SEEN-8: the held-out six committed 2026-11-24 ~07:16 UTC (evaluated 2026-11-28, so seen now)."""

SEEN_9: tuple[Row, ...] = (
    ("h400 s232 b2", H400, 232, 2, "single"),
    ("h304 s208 b3 DDP", H304, 208, 3, "ddp"),
    ("h832 s40 b3 FSDP2", H832, 40, 3, "fsdp2"),
    ("h528 s248 b1 FSDP2", H528, 248, 1, "fsdp2"),
    ("h560 s264 b1 ZeRO-1", H560, 264, 1, "zero1"),
    ("h176 s280 b8 ZeRO-1", H176, 280, 8, "zero1"),
)
"""SEEN-9: the held-out six committed 2026-11-28 ~09:00 UTC (evaluated the same morning, so seen now)."""

SEEN_10: tuple[Row, ...] = (
    ("h360 s196 b2", H360, 196, 2, "single"),
    ("h280 s244 b3 DDP", H280, 244, 3, "ddp"),
    ("h848 s60 b2 FSDP2", H848, 60, 2, "fsdp2"),
    ("h624 s140 b2 FSDP2", H624, 140, 2, "fsdp2"),
    ("h720 s100 b3 ZeRO-1", H720, 100, 3, "zero1"),
    ("h208 s300 b7 ZeRO-1", H208, 300, 7, "zero1"),
)
"""SEEN-10: the held-out six committed 2026-11-28 ~09:15 UTC (evaluated the same morning, so seen now)."""

SEEN_11: tuple[Row, ...] = (
    ("h440 s212 b2", H440, 212, 2, "single"),
    ("h312 s260 b3 DDP", H312, 260, 3, "ddp"),
    ("h816 s52 b3 FSDP2", H816, 52, 3, "fsdp2"),
    ("h600 s156 b2 FSDP2", H600, 156, 2, "fsdp2"),
    ("h680 s108 b3 ZeRO-1", H680, 108, 3, "zero1"),
    ("h184 s292 b8 ZeRO-1", H184, 292, 8, "zero1"),
)
"""SEEN-11: the held-out six committed 2026-11-28 ~10:00 UTC (evaluated the same morning, so seen now)."""

SEEN_12: tuple[Row, ...] = (
    ("h376 s228 b2", H376, 228, 2, "single"),
    ("h344 s188 b3 DDP", H344, 188, 3, "ddp"),
    ("h872 s68 b2 FSDP2", H872, 68, 2, "fsdp2"),
    ("h616 s164 b2 FSDP2", H616, 164, 2, "fsdp2"),
    ("h696 s124 b3 ZeRO-1", H696, 124, 3, "zero1"),
    ("h216 s284 b8 ZeRO-1", H216, 284, 8, "zero1"),
)
"""SEEN-12: the held-out six committed 2026-11-28 ~11:04 UTC (evaluated the same morning, so seen now)."""

SEEN_13: tuple[Row, ...] = (
    ("h392 s236 b2", H392, 236, 2, "single"),
    ("h328 s180 b3 DDP", H328, 180, 3, "ddp"),
    ("h888 s76 b2 FSDP2", H888, 76, 2, "fsdp2"),
    ("h632 s172 b2 FSDP2", H632, 172, 2, "fsdp2"),
    ("h712 s116 b3 ZeRO-1", H712, 116, 3, "zero1"),
    ("h232 s276 b8 ZeRO-1", H232, 276, 8, "zero1"),
)
"""SEEN-13: the held-out six committed 2026-11-28 ~12:05 UTC (evaluated the same day, so seen now)."""

SEEN_14: tuple[Row, ...] = (
    ("h408 s220 b2", H408, 220, 2, "single"),
    ("h296 s204 b3 DDP", H296, 204, 3, "ddp"),
    ("h904 s84 b2 FSDP2", H904, 84, 2, "fsdp2"),
    ("h648 s148 b2 FSDP2", H648, 148, 2, "fsdp2"),
    ("h728 s132 b3 ZeRO-1", H728, 132, 3, "zero1"),
    ("h248 s268 b8 ZeRO-1", H248, 268, 8, "zero1"),
)
"""SEEN-14: the held-out six committed 2026-11-28 ~13:30 UTC (evaluated the same day, so seen now)."""

SEEN_15: tuple[Row, ...] = (
    ("h424 s252 b2", H424, 252, 2, "single"),
    ("h264 s288 b3 DDP", H264, 288, 3, "ddp"),
    ("h920 s44 b2 FSDP2", H920, 44, 2, "fsdp2"),
    ("h664 s296 b2 FSDP2", H664, 296, 2, "fsdp2"),
    ("h744 s92 b3 ZeRO-1", H744, 92, 3, "zero1"),
    ("h168 s304 b8 ZeRO-1", H168, 304, 8, "zero1"),
)
"""SEEN-15: the held-out six committed 2026-11-28 ~16:06 UTC (evaluated the same day, so seen now)."""

SEEN_16: tuple[Row, ...] = (
    ("h472 s308 b2", H472, 308, 2, "single"),
    ("h456 s316 b3 DDP", H456, 316, 3, "ddp"),
    ("h936 s36 b3 FSDP2", H936, 36, 3, "fsdp2"),
    ("h568 s324 b2 FSDP2", H568, 324, 2, "fsdp2"),
    ("h760 s328 b2 ZeRO-1", H760, 328, 2, "zero1"),
    ("h152 s312 b8 ZeRO-1", H152, 312, 8, "zero1"),
)
"""SEEN-16: the held-out six committed 2026-11-28 ~17:20 UTC (evaluated the same day, so seen now)."""

SEEN_17: tuple[Row, ...] = (
    ("h488 s218 b2", H488, 218, 2, "single"),
    ("h520 s270 b3 DDP", H520, 270, 3, "ddp"),
    ("h952 s32 b3 FSDP2", H952, 32, 3, "fsdp2"),
    ("h584 s336 b2 FSDP2", H584, 336, 2, "fsdp2"),
    ("h776 s162 b2 ZeRO-1", H776, 162, 2, "zero1"),
    ("h144 s332 b8 ZeRO-1", H144, 332, 8, "zero1"),
)
"""SEEN-17: the held-out six committed 2026-11-28 ~19:12 UTC (evaluated the same day, so seen now)."""

SEEN_18: tuple[Row, ...] = (
    ("h504 s242 b2", H504, 242, 2, "single"),
    ("h536 s194 b3 DDP", H536, 194, 3, "ddp"),
    ("h944 s28 b3 FSDP2", H944, 28, 3, "fsdp2"),
    ("h552 s306 b2 FSDP2", H552, 306, 2, "fsdp2"),
    ("h792 s138 b2 ZeRO-1", H792, 138, 2, "zero1"),
    ("h136 s340 b8 ZeRO-1", H136, 340, 8, "zero1"),
)
"""SEEN-18: the held-out six committed 2026-11-28 ~19:55 UTC (evaluated the same day, so seen now)."""

SEEN_19: tuple[Row, ...] = (
    ("h688 s246 b2", H688, 246, 2, "single"),
    ("h752 s198 b3 DDP", H752, 198, 3, "ddp"),
    ("h960 s24 b3 FSDP2", H960, 24, 3, "fsdp2"),
    ("h824 s302 b2 FSDP2", H824, 302, 2, "fsdp2"),
    ("h840 s146 b2 ZeRO-1", H840, 146, 2, "zero1"),
    ("h128 s344 b8 ZeRO-1", H128, 344, 8, "zero1"),
)
"""SEEN-19: the held-out six committed 2026-11-28 ~21:15 UTC (evaluated the same day, so seen now)."""

SEEN_20: tuple[Row, ...] = (
    ("h864 s274 b2", H864, 274, 2, "single"),
    ("h808 s166 b3 DDP", H808, 166, 3, "ddp"),
    ("h968 s20 b3 FSDP2", H968, 20, 3, "fsdp2"),
    ("h880 s346 b2 FSDP2", H880, 346, 2, "fsdp2"),
    ("h896 s134 b2 ZeRO-1", H896, 134, 2, "zero1"),
    ("h120 s348 b8 ZeRO-1", H120, 348, 8, "zero1"),
)
"""SEEN-20: the held-out six committed 2026-11-28 ~21:36 UTC (evaluated the same day, so seen now)."""

NEW: tuple[Row, ...] = (
    ("h912 s278 b2", H912, 278, 2, "single"),
    ("h856 s170 b3 DDP", H856, 170, 3, "ddp"),
    ("h976 s16 b3 FSDP2", H976, 16, 3, "fsdp2"),
    ("h928 s350 b2 FSDP2", H928, 350, 2, "fsdp2"),
    ("h984 s130 b2 ZeRO-1", H984, 130, 2, "zero1"),
    ("h112 s352 b8 ZeRO-1", H112, 352, 8, "zero1"),
)
"""NEW (out-of-sample): six configurations none of which had been run when they were committed."""

SEEN: tuple[tuple[Row, ...], ...] = (SEEN_1, SEEN_2, SEEN_3, SEEN_4, SEEN_5, SEEN_6, SEEN_7, SEEN_8,
                                      SEEN_9, SEEN_10, SEEN_11, SEEN_12, SEEN_13, SEEN_14,
                                      SEEN_15, SEEN_16, SEEN_17, SEEN_18, SEEN_19,
                                      SEEN_20)
"""Every set whose errors have been looked at, in the order they were committed."""


def configs(rows: tuple[Row, ...], base: ModelSpec, nproc: int) -> list[StepConfig]:
    """The step configurations of `rows`: GPT-2's architecture (`base`) scaled to each shape; a
    single-process row runs on one process, the others on min(nproc, 2) (with nproc = 1 the
    distributed ones run on one process, no collective); the name is the label and "x<processes>"."""
    two = min(nproc, 2)
    out = []
    for label, shape, seq_len, micro_batch, strategy in rows:
        procs = 1 if strategy == "single" else two
        out.append(StepConfig(name=f"{label} x{procs}", model=scaled_model(base, **shape, kv_heads=None),
                              seq_len=seq_len, micro_batch=micro_batch, strategy=strategy, nproc=procs))
    return out


def step_configs(base: ModelSpec, nproc: int) -> list[StepConfig]:
    """SEEN-1, the four configurations of the first runs (`zplan calibrate hardware`'s default)."""
    return configs(SEEN_1, base, nproc)


def seen_configs(base: ModelSpec, nproc: int) -> list[StepConfig]:
    """Every configuration whose errors have been looked at: SEEN-1 to SEEN-20."""
    return [config for rows in SEEN for config in configs(rows, base, nproc)]


def new_heldout_configs(base: ModelSpec, nproc: int) -> list[StepConfig]:
    """NEW (out-of-sample): six configurations none of which had been run when they were committed."""
    return configs(NEW, base, nproc)
