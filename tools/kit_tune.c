/*
 * kit_tune.c -- the tuner's verdict (kit.h kit_tune_decide): which
 * candidate wins and whether it wins by enough to be recorded.
 */
#include <math.h>

#include "kit.h"

void kit_tune_decide(const double *medians, int n, double min_gain, kit_tune_verdict *v)
{
    v->winner = 0;
    v->planner_us = n >= 2 ? 0.5 * (medians[0] + medians[1]) : (n ? medians[0] : NAN);
    v->noise = n >= 2 && v->planner_us > 0 ? fabs(medians[0] - medians[1]) / v->planner_us : 0.0;
    v->winner_us = v->planner_us;
    for (int c = 2; c < n; c++)
        if (isfinite(medians[c]) && medians[c] < v->winner_us) { /* strict: a tie keeps the earlier */
            v->winner = c;
            v->winner_us = medians[c];
        }
    v->gain = v->winner_us > 0 ? v->planner_us / v->winner_us : 1.0;
    const double need = min_gain > 2.0 * v->noise ? min_gain : 2.0 * v->noise;
    v->best = v->winner;
    v->best_gain = v->gain;
    v->recorded = v->winner >= 2 && v->gain - 1.0 > need;
    if (!v->recorded) {
        v->winner = 0;
        v->winner_us = v->planner_us;
        v->gain = 1.0;
    }
}
