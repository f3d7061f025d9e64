/*
 * plan_names.cuh -- the kernel names the planners give their choices, kept
 * per thread. Formatting a name with snprintf is most of a planner's host
 * time (~80% of fc_sm90_plan's instructions at the mission shape), and an
 * eager loop plans the same kernel call after call; a name is a function of
 * a few small integers (the key), so each thread keeps its last few.
 * Host code; each planner has a table of its own.
 */
#ifndef FC_PLAN_NAMES_CUH
#define FC_PLAN_NAMES_CUH

#include <stdint.h>
#include <string.h>

struct PlanNames {
    static constexpr int N = 4, K = 6, LEN = 96;
    int32_t key[N][K];
    char name[N][LEN];
    int used, next;
};

/* Copy the name kept under key into out (LEN bytes) and return true, or
 * return false when none is. */
static inline bool plan_name_get(const PlanNames &t, const int32_t (&key)[PlanNames::K], char (&out)[PlanNames::LEN])
{
    for (int i = 0; i < t.used; ++i)
        if (memcmp(t.key[i], key, sizeof key) == 0) {
            memcpy(out, t.name[i], PlanNames::LEN);
            return true;
        }
    return false;
}

/* Keep name (NUL-terminated within LEN bytes) under key, over the oldest. */
static inline void plan_name_put(PlanNames &t, const int32_t (&key)[PlanNames::K], const char (&name)[PlanNames::LEN])
{
    const int i = t.next;
    memcpy(t.key[i], key, sizeof key);
    memcpy(t.name[i], name, PlanNames::LEN);
    t.next = (i + 1) % PlanNames::N;
    if (t.used < PlanNames::N) ++t.used;
}

#endif /* FC_PLAN_NAMES_CUH */
