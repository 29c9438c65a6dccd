/* main.c - ecs-mkmodel: writes a random-weight deepseek2 / qwen3moe GGUF with
 * the keys, tensor names, shapes and types llama.cpp writes and loads, for
 * tests and benchmarks. The tokenizer comes from a vocab GGUF (--vocab) or is
 * trained on the project's corpus. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/tokenizer/tokenizer.h"
#include "tools/ecs-mkmodel/mkmodel.h"

#define CORPUS_REL "coordinator/tokenizer/corpus.txt"
#define CORPUS_MAX ((long)64 << 20)
#define DEFAULT_MERGES 2000
/* llama.cpp's LLAMA_TOKEN_TYPE_UNUSED, what convert_hf_to_gguf.py gives the
 * [PAD<i>] tokens that fill a vocabulary up to the embedding's row count. */
#define TOKEN_TYPE_UNUSED 5

typedef struct {
    const char *arch, *preset, *types, *vocab, *corpus, *out, *name, *chat_template;
    const char *special_tokens;
    uint64_t seed;
    int n_merges, threads;
    double stddev;
    mk_hparams_t hp;
    bool dry_run;
    bool set[MK_MAX_PARAMS]; /* which mk_params were given */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ecs-mkmodel --arch deepseek2|qwen3moe --preset PRESET --types f32|q8_0|q4_k_m\n"
            "                   [--vocab VOCAB.gguf | --corpus TEXT [--n-merges N]] --seed N -o OUT.gguf\n"
            "                   [hyperparameter flags]\n"
            "presets: deepseek2: tiny, tiny-27l, ds2-lite; qwen3moe: tiny, qwen3-30b-a3b\n"
            "other flags: --name NAME (general.name), --std S (weight stddev, default 0.02),\n"
            "             --chat-template FILE: its text becomes tokenizer.chat_template\n"
            "             (instead of the vocabulary's; e.g. a Qwen3-style template)\n"
            "             --special-tokens A,B,...: the first padding rows become these\n"
            "             CONTROL tokens (make room with --vocab-size; e.g. a template's\n"
            "             markup, as DeepSeek-V3's tool-call tokens)\n"
            "             --threads N (default: online CPUs), -h/--help\n"
            "             --dry-run: print the tensor plan (name, type, ne) and the bytes per\n"
            "             type instead of writing a file\n"
            "without --vocab a BPE tokenizer is trained on ./" CORPUS_REL " (or --corpus);\n"
            "vocab size = its token count unless the preset or --vocab-size asks for more rows\n"
            "(the extra tokens are [PAD<i>], as llama.cpp's converter pads).\n"
            "hyperparameter flags (override the preset):\n");
    for (int i = 0; i < mk_n_params; i++)
        fprintf(f, "  --%-22s %s\n", mk_params[i].flag, mk_params[i].help);
}

static ecs_err_t parse_i64(const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return ecs_error(ECS_ERR_INVAL, "--%s: '%s' is not an integer in [%lld, %lld]", flag, s,
                         (long long)lo, (long long)hi);
    *out = v;
    return ECS_OK;
}

static ecs_err_t parse_f64(const char *flag, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end)
        return ecs_error(ECS_ERR_INVAL, "--%s: '%s' is not a number", flag, s);
    *out = v;
    return ECS_OK;
}

static ecs_err_t set_param(opts_t *o, int idx, const char *val)
{
    const mk_param_t *p = &mk_params[idx];
    char *field = (char *)&o->hp + p->offset;
    ecs_err_t err;
    o->set[idx] = true;
    if (p->is_float)
        return parse_f64(p->flag, val, (double *)field);
    int64_t v;
    if ((err = parse_i64(p->flag, val, 0, INT64_MAX / 2, &v)))
        return err;
    memcpy(field, &v, sizeof v);
    return ECS_OK;
}

static int param_index(const char *flag)
{
    for (int i = 0; i < mk_n_params; i++)
        if (!strcmp(mk_params[i].flag, flag))
            return i;
    return -1;
}

/* Flags that take a string, stored as given. */
static const struct {
    const char *name;
    size_t offset;
} str_opts[] = {
    { "arch", offsetof(opts_t, arch) },     { "preset", offsetof(opts_t, preset) },
    { "types", offsetof(opts_t, types) },   { "type", offsetof(opts_t, types) },
    { "vocab", offsetof(opts_t, vocab) },   { "corpus", offsetof(opts_t, corpus) },
    { "o", offsetof(opts_t, out) },         { "output", offsetof(opts_t, out) },
    { "name", offsetof(opts_t, name) },     { "chat-template", offsetof(opts_t, chat_template) },
    { "special-tokens", offsetof(opts_t, special_tokens) },
};
#define N_STR_OPTS (sizeof str_opts / sizeof str_opts[0])
static const char *const num_opts[] = { "seed", "n-merges", "threads", "std" };
#define N_NUM_OPTS (sizeof num_opts / sizeof num_opts[0])

static bool is_option(const char *name)
{
    for (size_t i = 0; i < N_STR_OPTS; i++)
        if (!strcmp(name, str_opts[i].name))
            return true;
    for (size_t i = 0; i < N_NUM_OPTS; i++)
        if (!strcmp(name, num_opts[i]))
            return true;
    return param_index(name) >= 0;
}

/* Hyperparameter flags are remembered as strings and applied after the
 * preset, so their order relative to --preset does not matter. */
typedef struct {
    int idx;
    const char *val;
} pending_t;

static ecs_err_t set_option(opts_t *o, const char *name, const char *val, pending_t *pend,
                            int *n_pend)
{
    ecs_err_t err = ECS_OK;
    int64_t v;
    int idx = param_index(name);
    if (idx >= 0) {
        pend[(*n_pend)++] = (pending_t){ idx, val };
        return ECS_OK;
    }
    for (size_t i = 0; i < N_STR_OPTS; i++) {
        if (!strcmp(name, str_opts[i].name)) {
            memcpy((char *)o + str_opts[i].offset, &val, sizeof val);
            return ECS_OK;
        }
    }
    if (!strcmp(name, "seed")) {
        if (!(err = parse_i64("seed", val, 0, INT64_MAX, &v)))
            o->seed = (uint64_t)v;
    } else if (!strcmp(name, "n-merges")) {
        if (!(err = parse_i64("n-merges", val, 1, 1 << 20, &v)))
            o->n_merges = (int)v;
    } else if (!strcmp(name, "threads")) {
        if (!(err = parse_i64("threads", val, 1, 64, &v)))
            o->threads = (int)v;
    } else if (!(err = parse_f64("std", val, &o->stddev)) && !(o->stddev > 0 && o->stddev < 1e6)) {
        err = ecs_error(ECS_ERR_RANGE, "--std %g must be positive", o->stddev);
    }
    return err;
}

/* Accepts "--flag value", "--flag=value" and "-o value". */
static ecs_err_t parse_args(int argc, char **argv, opts_t *o, pending_t *pend, int *n_pend)
{
    ecs_err_t err;
    *n_pend = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--dry-run")) {
            o->dry_run = true;
            continue;
        }
        if (strncmp(a, "--", 2) && strcmp(a, "-o"))
            return ecs_error(ECS_ERR_INVAL, "unexpected argument '%s'", a);
        const char *flag = a[1] == '-' ? a + 2 : "o";
        const char *val = strchr(flag, '=');
        char name[64];
        size_t len = val ? (size_t)(val - flag) : strlen(flag);
        if (len < sizeof name) {
            memcpy(name, flag, len);
            name[len] = 0;
        }
        if (len >= sizeof name || !is_option(name))
            return ecs_error(ECS_ERR_INVAL, "unknown flag '%s' (see --help)", a);
        if (val)
            val++;
        else if (i + 1 < argc)
            val = argv[++i];
        else
            return ecs_error(ECS_ERR_INVAL, "flag '%s' needs a value", a);
        if ((err = set_option(o, name, val, pend, n_pend)))
            return err;
    }
    if (!o->arch)
        return ecs_error(ECS_ERR_INVAL, "--arch is required (deepseek2, qwen3moe)");
    if (!o->out)
        return ecs_error(ECS_ERR_INVAL, "-o OUT.gguf is required");
    return ECS_OK;
}

/* ------------------------------------------------------------ tokenizer */

static ecs_err_t read_text(const char *path, char **text, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ecs_error(ECS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ecs_err_t err = ECS_OK;
    char *buf = NULL;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        err = ecs_error(ECS_ERR_IO, "%s: cannot size: %s", path, strerror(errno));
    else if (size > CORPUS_MAX)
        err = ecs_error(ECS_ERR_RANGE, "%s: %ld bytes, more than the %ld allowed for a corpus",
                        path, size, CORPUS_MAX);
    else if (!(buf = malloc((size_t)size + 1)))
        err = ecs_error(ECS_ERR_NOMEM, "%s: out of memory", path);
    else if (fread(buf, 1, (size_t)size, f) != (size_t)size)
        err = ecs_error(ECS_ERR_IO, "%s: read failed", path);
    fclose(f);
    if (err) {
        free(buf);
        return err;
    }
    buf[size] = 0;
    *text = buf;
    *len = (size_t)size;
    return ECS_OK;
}

/* --corpus, else ./CORPUS_REL, else relative to the executable in
 * BUILD/bin (two levels down) or BUILD/x/bin (three). */
static ecs_err_t find_corpus(const char *given, char *out, size_t cap)
{
    if (given) {
        snprintf(out, cap, "%s", given);
        return ECS_OK;
    }
    if (access(CORPUS_REL, R_OK) == 0) {
        snprintf(out, cap, "%s", CORPUS_REL);
        return ECS_OK;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash)
            *slash = 0;
        static const char *const ups[] = { "/../../", "/../../../" };
        for (size_t i = 0; i < sizeof ups / sizeof ups[0]; i++) {
            if ((size_t)snprintf(out, cap, "%s%s%s", exe, ups[i], CORPUS_REL) < cap &&
                access(out, R_OK) == 0)
                return ECS_OK;
        }
    }
    return ecs_error(ECS_ERR_NOTFOUND, "no tokenizer corpus: give --vocab VOCAB.gguf or --corpus "
                     "PATH (looked for ./%s and next to the executable)", CORPUS_REL);
}

/* Trains a tokenizer and returns it as an opened vocab-only GGUF, so that
 * both tokenizer sources are copied by the same code. The scratch file is
 * unlinked once mapped. */
static ecs_err_t train_vocab(const opts_t *o, const char *scratch, gguf_file_t **vf)
{
    char corpus[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    gguf_writer_t *tw = NULL;
    ecs_err_t err;
    if ((err = find_corpus(o->corpus, corpus, sizeof corpus)) ||
        (err = read_text(corpus, &text, &len)) || (err = gguf_writer_new(&tw)))
        goto done;
    if ((err = tok_train_to_gguf(text, len, o->n_merges, tw, NULL)) ||
        (err = gguf_writer_begin(tw, scratch)) || (err = gguf_writer_finish(tw)))
        goto done;
    err = gguf_open(scratch, vf);
done:
    unlink(scratch);
    gguf_writer_free(tw);
    free(text);
    return err;
}

static bool is_key(const gguf_kv_t *kv, const char *key) { return gguf_str_eq(kv->key, key); }

/* --special-tokens: texts of the first padding rows, CONTROL. */
typedef struct {
    gguf_str_t v[64];
    size_t n;
} specials_t;

/* A copy of the per-token array v grown to n_total entries with the values
 * llama.cpp's converter uses for padding tokens (the first sp->n of them
 * the special tokens). */
static ecs_err_t pad_array(const gguf_kv_t *kv, uint64_t n_total, const specials_t *sp,
                           gguf_value_t *out, void **mem)
{
    const gguf_value_t *v = &kv->value;
    uint64_t n = v->arr.n;
    *out = *v;
    out->arr.n = n_total;
    if (v->arr.elem_type == GGUF_TYPE_STRING) {
        enum { PAD_LEN = 24 };
        gguf_str_t *strs = malloc(n_total * sizeof *strs + (n_total - n) * PAD_LEN);
        if (!strs)
            return ecs_error(ECS_ERR_NOMEM, "vocab padding: out of memory");
        char *text = (char *)(strs + n_total);
        memcpy(strs, v->arr.strs, n * sizeof *strs);
        for (uint64_t i = n; i < n_total; i++) {
            char *s = text + (i - n) * PAD_LEN;
            int l = snprintf(s, PAD_LEN, "[PAD%llu]", (unsigned long long)i);
            strs[i] = i - n < sp->n ? sp->v[i - n] : (gguf_str_t){ s, (uint64_t)l };
        }
        out->arr.strs = strs;
        *mem = strs;
        return ECS_OK;
    }
    /* token_type (INT32) or scores (FLOAT32): both 4-byte elements */
    int32_t *raw = malloc(n_total * 4);
    if (!raw)
        return ecs_error(ECS_ERR_NOMEM, "vocab padding: out of memory");
    memcpy(raw, v->arr.raw, n * 4);
    float score = -1000.0f;
    for (uint64_t i = n; i < n_total; i++) {
        if (v->arr.elem_type == GGUF_TYPE_INT32)
            raw[i] = i - n < sp->n ? TOK_TYPE_CONTROL : TOKEN_TYPE_UNUSED;
        else
            memcpy(&raw[i], &score, 4);
    }
    out->arr.raw = raw;
    *mem = raw;
    return ECS_OK;
}

static bool per_token_array(const gguf_kv_t *kv, uint64_t n_tokens)
{
    const gguf_value_t *v = &kv->value;
    if (v->type != GGUF_TYPE_ARRAY || v->arr.n != n_tokens)
        return false;
    return (is_key(kv, "tokenizer.ggml.tokens") && v->arr.elem_type == GGUF_TYPE_STRING) ||
           (is_key(kv, "tokenizer.ggml.token_type") && v->arr.elem_type == GGUF_TYPE_INT32) ||
           (is_key(kv, "tokenizer.ggml.scores") && v->arr.elem_type == GGUF_TYPE_FLOAT32);
}

/* Copies every tokenizer.* key of vf in its order; per-token arrays are padded
 * from n_tokens to n_total entries. */
static ecs_err_t copy_tokenizer(gguf_writer_t *w, const gguf_file_t *vf, uint64_t n_tokens,
                                uint64_t n_total, const specials_t *sp)
{
    static const char prefix[] = "tokenizer.";
    for (uint64_t i = 0; i < gguf_n_kv(vf); i++) {
        const gguf_kv_t *kv = gguf_kv_at(vf, i);
        char key[256];
        if (kv->key.len < sizeof prefix - 1 || memcmp(kv->key.ptr, prefix, sizeof prefix - 1))
            continue;
        if (kv->key.len >= sizeof key)
            return ecs_error(ECS_ERR_FORMAT, "%s: key of %llu bytes", gguf_path(vf),
                             (unsigned long long)kv->key.len);
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = 0;
        gguf_value_t padded;
        void *mem = NULL;
        const gguf_value_t *v = &kv->value;
        ecs_err_t err = ECS_OK;
        if (n_total > n_tokens && per_token_array(kv, n_tokens)) {
            err = pad_array(kv, n_total, sp, &padded, &mem);
            v = &padded;
        }
        if (!err)
            err = gguf_writer_set_value(w, key, v);
        free(mem);
        if (err)
            return err;
    }
    return ECS_OK;
}

static ecs_err_t token_count(const gguf_file_t *vf, uint64_t *n)
{
    const gguf_value_t *arr;
    ecs_err_t err = gguf_get_arr(vf, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr);
    if (err)
        return ecs_error(err, "%s: no tokenizer.ggml.tokens string array: %s", gguf_path(vf),
                         ecs_errmsg());
    *n = arr->arr.n;
    return ECS_OK;
}

/* --chat-template FILE: the file's text as tokenizer.chat_template (set
 * after the copied tokenizer keys: the writer replaces the vocabulary's). */
static ecs_err_t set_chat_template(gguf_writer_t *w, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return ecs_error(ECS_ERR_IO, "--chat-template %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0, got;
    ecs_err_t err = ECS_OK;
    do {
        if (cap - len < 4096) {
            char *p = cap > (1u << 24) ? NULL : realloc(text, cap = cap ? 2 * cap : 8192);
            if (!p) {
                err = ecs_error(ECS_ERR_NOMEM, "--chat-template %s: too large or out of memory",
                                path);
                break;
            }
            text = p;
        }
        got = fread(text + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    if (!err && ferror(f))
        err = ecs_error(ECS_ERR_IO, "--chat-template %s: read error", path);
    fclose(f);
    if (!err && memchr(text, '\0', len))
        err = ecs_error(ECS_ERR_INVAL, "--chat-template %s: holds a NUL byte", path);
    if (!err) {
        text[len] = '\0';
        err = gguf_writer_set_str(w, "tokenizer.chat_template", text);
    }
    free(text);
    return err;
}

/* ----------------------------------------------------------------- main */

static void print_plan(const mk_tensor_t *t, int n)
{
    double by_type[ECS_TYPE_COUNT] = { 0 }, total = 0;
    for (int i = 0; i < n; i++) {
        double b = (double)ecs_row_size(t[i].type, t[i].ne[0]) * (double)(t[i].ne[1] * t[i].ne[2]);
        by_type[t[i].type] += b;
        total += b;
        printf("tensor %s %s %lld", t[i].name, ecs_type_name(t[i].type), (long long)t[i].ne[0]);
        for (uint32_t d = 1; d < t[i].n_dims; d++)
            printf("x%lld", (long long)t[i].ne[d]);
        printf("\n");
    }
    for (int ty = 0; ty < ECS_TYPE_COUNT; ty++)
        if (by_type[ty] > 0)
            printf("bytes %s %.0f %.1f%%\n", ecs_type_name((ecs_type_t)ty), by_type[ty],
                   100.0 * by_type[ty] / total);
    printf("total %.0f\n", total);
}

typedef struct {
    mk_arch_t arch;
    mk_ftype_t ft;
    gguf_file_t *vf;
    gguf_writer_t *w;
    mk_tensor_t *tensors;
    int n_tensors;
    char part[PATH_MAX];
} run_t;

/* Decides the vocab size: the vocab file's token count with --vocab;
 * otherwise the trained count, grown to the preset's / --vocab-size rows. */
static ecs_err_t settle_vocab(const opts_t *o, mk_hparams_t *hp, uint64_t n_tokens)
{
    int vs = param_index("vocab-size");
    if (o->vocab) {
        if (o->set[vs])
            return ecs_error(ECS_ERR_INVAL, "--vocab-size cannot be combined with --vocab (the "
                             "vocab file's %llu tokens fix it)", (unsigned long long)n_tokens);
        hp->vocab_size = (int64_t)n_tokens;
    } else if (hp->vocab_size == 0) {
        hp->vocab_size = (int64_t)n_tokens;
    } else if ((uint64_t)hp->vocab_size < n_tokens) {
        return ecs_error(ECS_ERR_INVAL, "vocab size %lld is smaller than the trained tokenizer's "
                         "%llu tokens", (long long)hp->vocab_size, (unsigned long long)n_tokens);
    }
    return ECS_OK;
}

/* --special-tokens A,B,...: each new, and room for them in the padding. */
static ecs_err_t parse_specials(const char *list, const gguf_file_t *vf, uint64_t n_tokens,
                                uint64_t n_total, specials_t *sp)
{
    sp->n = 0;
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0 || sp->n == sizeof sp->v / sizeof sp->v[0])
            return ecs_error(ECS_ERR_INVAL, "--special-tokens: %s", len ? "more than 64 tokens"
                             : "an empty token (give A,B,... without empty entries)");
        const gguf_value_t *arr;
        if (gguf_get_arr(vf, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &arr) == ECS_OK)
            for (uint64_t i = 0; i < arr->arr.n; i++)
                if (arr->arr.strs[i].len == len && !memcmp(arr->arr.strs[i].ptr, p, len))
                    return ecs_error(ECS_ERR_INVAL, "--special-tokens: '%.*s' is already token %llu",
                                     (int)len, p, (unsigned long long)i);
        sp->v[sp->n++] = (gguf_str_t){ p, (uint64_t)len };
        p = end ? end + 1 : NULL;
    }
    if (sp->n > n_total - n_tokens)
        return ecs_error(ECS_ERR_INVAL, "--special-tokens: %zu tokens need as many padding rows; "
                         "the vocabulary has %llu tokens in %llu rows (raise --vocab-size)", sp->n,
                         (unsigned long long)n_tokens, (unsigned long long)n_total);
    return ECS_OK;
}

static ecs_err_t build(const opts_t *o, run_t *r)
{
    specials_t sp;
    mk_hparams_t hp;
    ecs_err_t err;
    uint64_t n_tokens = 0;
    char name[128];
    if ((err = mk_parse_arch(o->arch, &r->arch)) || (err = mk_parse_ftype(o->types, &r->ft)) ||
        (err = mk_preset(r->arch, o->preset, &hp)))
        return err;
    for (int i = 0; i < mk_n_params; i++)
        if (o->set[i])
            memcpy((char *)&hp + mk_params[i].offset, (const char *)&o->hp + mk_params[i].offset,
                   mk_params[i].is_float ? sizeof(double) : sizeof(int64_t));
    if (o->vocab && o->corpus)
        return ecs_error(ECS_ERR_INVAL, "give either --vocab or --corpus, not both");
    if (o->vocab)
        err = gguf_open(o->vocab, &r->vf);
    else if ((size_t)snprintf(r->part, sizeof r->part, "%s.vocab.part", o->out) >= sizeof r->part)
        err = ecs_error(ECS_ERR_INVAL, "output path too long");
    else
        err = train_vocab(o, r->part, &r->vf);
    if (err || (err = token_count(r->vf, &n_tokens)) || (err = settle_vocab(o, &hp, n_tokens)) ||
        (err = mk_validate(r->arch, &hp, o->set[param_index("q-lora-rank")])) ||
        (err = parse_specials(o->special_tokens, r->vf, n_tokens, (uint64_t)hp.vocab_size, &sp)) ||
        (err = mk_tensor_list(r->arch, r->ft, &hp, &r->tensors, &r->n_tensors)) ||
        (err = gguf_writer_new(&r->w)))
        return err;
    snprintf(name, sizeof name, "%s", o->name ? o->name : "");
    if (!o->name)
        snprintf(name, sizeof name, "ecs-%s-%s", mk_arch_name(r->arch), o->preset);
    if ((err = mk_write_meta_head(r->w, r->arch, r->ft, &hp, name)) ||
        (err = copy_tokenizer(r->w, r->vf, n_tokens, (uint64_t)hp.vocab_size, &sp)) ||
        (o->chat_template && (err = set_chat_template(r->w, o->chat_template))) ||
        (err = mk_write_meta_tail(r->w, r->arch, r->ft)))
        return err;
    if (o->dry_run) {
        print_plan(r->tensors, r->n_tensors);
        return ECS_OK;
    }
    /* Written under a temporary name so that a failed or interrupted run
     * never leaves a truncated OUT behind. */
    if ((size_t)snprintf(r->part, sizeof r->part, "%s.part", o->out) >= sizeof r->part)
        return ecs_error(ECS_ERR_INVAL, "output path too long");
    err = mk_generate(r->w, r->part, r->tensors, r->n_tensors, o->seed, (float)o->stddev,
                      o->threads);
    if (!err && rename(r->part, o->out) != 0)
        err = ecs_error(ECS_ERR_IO, "%s: cannot rename to %s: %s", r->part, o->out,
                        strerror(errno));
    if (err)
        unlink(r->part);
    return err;
}

int main(int argc, char **argv)
{
    opts_t o = { .preset = "tiny", .types = "q8_0", .seed = 1234, .n_merges = DEFAULT_MERGES,
                 .stddev = 0.02 };
    pending_t pend[256];
    int n_pend = 0;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o.threads = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
    if (argc > (int)(sizeof pend / sizeof pend[0])) {
        fprintf(stderr, "ecs-mkmodel: error: too many arguments\n");
        return 2;
    }
    ecs_err_t err = parse_args(argc, argv, &o, pend, &n_pend);
    for (int i = 0; !err && i < n_pend; i++)
        err = set_param(&o, pend[i].idx, pend[i].val);
    if (err) {
        fprintf(stderr, "ecs-mkmodel: error: %s\n", ecs_errmsg());
        usage(stderr);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_t r = { 0 };
    err = build(&o, &r);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!err && !o.dry_run) {
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        fprintf(stderr, "ecs-mkmodel: wrote %s (%s %s %s, %d tensors) in %.1f s\n", o.out,
                mk_arch_name(r.arch), o.preset, o.types, r.n_tensors, secs);
    } else if (err) {
        fprintf(stderr, "ecs-mkmodel: error: %s\n", ecs_errmsg());
    }
    gguf_writer_free(r.w);
    gguf_close(r.vf);
    free(r.tensors);
    return err ? 1 : 0;
}
