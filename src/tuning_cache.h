/*
 * tuning_cache.h -- the tuning cache: measured kernel choices keyed by the
 * build, the device and a shape bucket (docs/TUNING.md has the file format
 * and the rules). A loaded cache is immutable and shared by the contexts
 * that load the same file; recording into a context copies it first.
 *
 *   tuning_cache.c  buckets, keys, lookup, record, load/share/release
 *   tuning_file.c   the text format: parse and write
 */
#ifndef FC_TUNING_CACHE_H
#define FC_TUNING_CACHE_H

#include <stdint.h>

#include "internal.h"

/* A shape bucket packed in 64 bits; each field's bits (FC_TK_*) can be a
 * wildcard in an entry. Lengths and batch*heads are bucket indices
 * (fc_tune_bucket). */
#define FC_TK_FIELDS(X)                                                                                  \
    X(PASS, 0, 1)    /* 0 forward, 1 backward                                  */                        \
    X(DET, 1, 1)     /* backward: deterministic                                */                        \
    X(DTYPE, 2, 3)   /* q's fc_dtype                                           */                        \
    X(KV, 5, 3)      /* k/v's fc_dtype                                         */                        \
    X(D, 8, 10)      /* head_dim                                               */                        \
    X(GQA, 18, 10)   /* heads_q / heads_kv (1023 and up share one value)       */                        \
    X(MASK, 28, 2)   /* 0 none, 1 causal band (no left window), 2 local window */                        \
    X(FLAGS, 30, 4)  /* FC_TF_* bits                                           */                        \
    X(SQ, 34, 7)     /* bucket of seqlen_q (varlen: the maximum)               */                        \
    X(SK, 41, 7)     /* bucket of seqlen_k                                     */                        \
    X(BH, 48, 7)     /* bucket of batch * heads_q                              */
#define FC_TK_ENUM(name, shift, bits) FC_TK_##name##_SHIFT = shift, FC_TK_##name##_BITS = bits,
enum { FC_TK_FIELDS(FC_TK_ENUM) FC_TK_COUNT_ = 0 };
#undef FC_TK_ENUM
#define FC_TK_MASK(name) ((((uint64_t)1 << FC_TK_##name##_BITS) - 1) << FC_TK_##name##_SHIFT)
#define FC_TK_GET(key, name) ((int)(((key) >> FC_TK_##name##_SHIFT) & (((uint64_t)1 << FC_TK_##name##_BITS) - 1)))

/* FLAGS bits. */
#define FC_TF_SOFTCAP 1
#define FC_TF_VARLEN 2
#define FC_TF_PAGED 4
#define FC_TF_APPEND 8

/* Buckets of a length or count: 0, then 1, 2, 3, 4, 6, 8, 12, 16, 24, ...
 * (powers of two and their 1.5x): index of the smallest bound >= x, and
 * the bound of an index (fc_tune_bound(fc_tune_bucket(x)) >= x). */
int fc_tune_bucket(int64_t x);
int64_t fc_tune_bound(int index);

/* The bucket key of a forward call (b NULL) or a backward call (p = &b->f). */
uint64_t fc_tune_key(const fc_fwd_params *p, const fc_bwd_params *b);

/* What an entry chooses: a CUDA path (0 either) and the fc_tuning fields
 * it sets (the others at fc_tuning_init's values; no trace file). */
typedef struct fc_tune_choice {
    int32_t path;
    fc_tuning t;
} fc_tune_choice;

/* The int32 fields of fc_tuning, in file order, with their defaults, ranges
 * and the entries that may set them: the one table behind fc_tuning_init,
 * fc_context_set_tuning's checks, the cache file's parser and writer and
 * the merge of an entry under a context's hooks. */
typedef struct fc_tune_field {
    const char *name;
    size_t off;                      /* in fc_tuning                              */
    int32_t def, lo, hi;             /* hi unused when rows is set                */
    int (*rows)(int, fc_tile_row *); /* the row table a *_config field indexes    */
    int passes;                      /* FC_TUNE_FWD | FC_TUNE_BWD: entries setting it */
} fc_tune_field;
#define FC_TUNE_FWD 1
#define FC_TUNE_BWD 2
#define FC_TUNE_NUM_FIELDS 10
extern const fc_tune_field fc_tune_fields[FC_TUNE_NUM_FIELDS];

static inline int32_t *fc_tune_at(fc_tuning *t, const fc_tune_field *f) { return (int32_t *)((char *)t + f->off); }
static inline int32_t fc_tune_get(const fc_tuning *t, const fc_tune_field *f)
{
    return *(const int32_t *)((const char *)t + f->off);
}
/* The largest value f takes in this build: hi, or the last index of its
 * row table (-1 in a build without that table). */
int32_t fc_tune_field_max(const fc_tune_field *f);

typedef struct fc_tune_entry {
    uint64_t key;   /* the bucket, wildcard bits zero  */
    uint64_t wild;  /* FC_TK_MASK bits of wildcard fields */
    fc_tune_choice choice;
    char *comment;  /* NULL or the text after '#'      */
} fc_tune_entry;

/* One `device` line and its entries. A field of -1 (gpu "*") is a wildcard. */
typedef struct fc_tune_section {
    char library[32];        /* version string, "*" = any             */
    char tables[16];         /* fc_tune_tables_id() as hex, "*" = any */
    int32_t cc, sms, cudart; /* cc = major * 10 + minor               */
    char gpu[128];
    int applies;             /* library and tables match this build    */
    fc_tune_entry *exact;    /* sorted by key, no wildcard             */
    int n_exact, cap_exact;
    fc_tune_entry *wild;     /* in file order                          */
    int n_wild, cap_wild;
} fc_tune_section;

typedef struct fc_tune_cache {
    int refs;                /* guarded by the registry's lock (tuning_cache.c) */
    char *path;              /* where it was loaded from, or NULL               */
    int64_t dev, ino, size, mtime_ns; /* that file's identity (sharing)          */
    fc_tune_section *sec;
    int n_sec, cap_sec;
    int shared;              /* 1: loaded through the registry, never modified   */
} fc_tune_cache;

/* A hex identity of this build's tile tables (their every field): row
 * indices in a cache mean something only for the tables they were tuned
 * on. "0" in a build without CUDA. */
const char *fc_tune_tables_id(void);

/* The entry for key on dev, or NULL: exact entries of every section that
 * applies and matches dev first (file order of sections), then wildcard
 * entries in file order. */
const fc_tune_entry *fc_tune_find(const fc_tune_cache *c, const fc_cuda_device *dev, uint64_t key);

/* Load path (sharing an already loaded, unchanged file) or drop (path NULL)
 * the cache *slot holds; on error *slot is unchanged and err says why. */
fc_status fc_tune_cache_load(fc_tune_cache **slot, const char *path, char *err, size_t err_len);
void fc_tune_cache_release(fc_tune_cache *c);
/* The cache of FLASHCORE_TUNING_CACHE, read once per process: a new
 * reference, or NULL (unset, or not loaded: *st and err say why). */
fc_tune_cache *fc_tune_cache_from_env(fc_status *st, char *err, size_t err_len);

/* Record choice for key on dev in *slot (a private copy is made first if
 * the cache is shared; a new section for dev if none matches it exactly);
 * choice NULL: remove key's exact entry on dev, if there is one. */
fc_status fc_tune_record(fc_tune_cache **slot, const fc_cuda_device *dev, uint64_t key, const fc_tune_choice *choice,
                         const char *comment, char *err, size_t err_len);

/* tuning_file.c: parse text into a new cache / write a cache as text. */
fc_status fc_tune_parse(const char *text, size_t len, const char *path, fc_tune_cache **out, char *err, size_t err_len);
fc_status fc_tune_write(const fc_tune_cache *c, const char *path, char *err, size_t err_len);
/* Append entry e to section s (exact entries kept sorted, a duplicate key
 * replaced when replace, else FC_ERR_INVALID_ARGUMENT). Takes e->comment. */
fc_status fc_tune_section_add(fc_tune_section *s, fc_tune_entry *e, int replace);
void fc_tune_cache_free(fc_tune_cache *c);
/* NULL, or why choice cannot be a forward (bwd 0) or backward entry (a
 * field that fc_tune_fields does not allow it), written into buf. */
const char *fc_tune_choice_misfit(const fc_tune_choice *c, int bwd, char *buf, size_t n);
/* Fields of a choice that set something (not at fc_tuning_init's value). */
int fc_tune_choice_sets(const fc_tune_choice *c);

#endif /* FC_TUNING_CACHE_H */
