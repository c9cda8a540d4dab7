"""False alarms and power of compare's "slower" rule on iid log-normal timing samples.

The rule: two-sided Mann-Whitney U p < alpha AND ratio of medians > threshold. Prints, for
each noise level (sigma of log time), samples per side and true ratio, the fraction of 1000
trials flagged slower at alpha 0.002 and 0.05 (threshold 1.1), and at alpha 0.05 with no
threshold. The figures in docs/compare.md come from this script (seed 1). Run:
    python scripts/compare_power.py
"""

import numpy as np
from scipy.stats import mannwhitneyu

REPS = 1000


def main() -> None:
    rng = np.random.default_rng(1)
    print("sigma n  true  | alpha=0.002,t=1.1  alpha=0.05,t=1.1  alpha=0.05,t=1.0")
    for sigma in (0.05, 0.2, 0.5):
        for n in (7, 10, 20, 40):
            for true in (1.0, 1.1, 1.2, 1.5):
                hits = np.zeros(3)
                for _ in range(REPS):
                    b = np.exp(rng.normal(0, sigma, n))
                    x = true * np.exp(rng.normal(0, sigma, n))
                    p = mannwhitneyu(x, b, alternative="two-sided").pvalue
                    r = np.median(x) / np.median(b)
                    hits += [p < 0.002 and r > 1.1, p < 0.05 and r > 1.1, p < 0.05 and r > 1.0]
                cells = "  ".join(f"{h / REPS:>16.3f}" for h in hits)
                print(f"{sigma:<5} {n:<3} {true:<4}  | {cells}")


if __name__ == "__main__":
    main()
