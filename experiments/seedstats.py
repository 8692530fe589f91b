"""Means over seeds with a 95% interval, shared by the results tables.

The seeds of one configuration are independent runs, so the interval of their mean is
Student's t: mean +- t(0.975, n - 1) * sd / sqrt(n), sd the sample standard deviation.
With 2 seeds t is 12.7 and the interval is wide; that is what two seeds can say.
Standard library only.
"""
import math
import statistics

# Two-sided 95% Student t quantiles, by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    """The quantile for df degrees of freedom, or for the largest tabled df below it
    (a slightly wider interval, never a narrower one); None below 1."""
    keys = [k for k in T95 if k <= df]
    return T95[max(keys)] if keys else None


def mean_ci(xs):
    """(mean, half-width of its 95% interval); the half-width is None for one value."""
    xs = list(xs)
    m = statistics.fmean(xs)
    t = t95(len(xs) - 1)
    if t is None:
        return m, None
    return m, t * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt_mean_ci(xs, scale=1.0, digits=2):
    """'m [lo, hi]' of the values times scale, or just 'm' for one value."""
    m, h = mean_ci([scale * x for x in xs])
    if h is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{m - h:.{digits}f}, {m + h:.{digits}f}]"
