/* tok_pretok.c - the regex pre-tokenizer: splits text into the words BPE
 * works on, with the regex lists llama.cpp uses for each tokenizer.ggml.pre.
 *
 * llama.cpp applies the regexes one after another: each regex runs over every
 * piece the previous ones produced, and both its matches and the gaps between
 * them become pieces. Its std::regex engine sees non-ASCII whitespace as
 * U+000B; we do the same by matching on a copy of the text in which those
 * code points are replaced (and mapping offsets back), so that \s means
 * exactly llama.cpp's whitespace set (which includes U+0085, unlike PCRE2's)
 * and U+3000 is whitespace rather than a member of the CJK punctuation class.
 * Unicode categories (\p{L}, \p{N}, ...) come from PCRE2 with UCP. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define PRE_MAX_RE 4
#define PRE_MAX_NAMES 4

typedef struct {
    const char *names[PRE_MAX_NAMES]; /* names[0] is the canonical one */
    int n_re;
    const char *re[PRE_MAX_RE + 2];
} pre_def_t;

/* Cased letters as listed by DeepSeek's tokenizer.json (a subset of
 * \p{Lu}\p{Ll}\p{Lt}; the gaps are DeepSeek's, kept for exactness). */
#define DS_LLM_LETTERS                                                                           \
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"                 \
    "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"         \
    "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}" \
    "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"  \
    "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}"                 \
    "\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}"                 \
    "\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}"         \
    "\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"        \
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}"                 \
    "\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}"         \
    "\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"                   \
    "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"         \
    "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}"                  \
    "\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"                 \
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}"                 \
    "\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}"           \
    "\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"

/* CJK ideographs, Hangul and the block before them (DeepSeek LLM/Coder). */
#define DS_CJK "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

/* Differences from llama.cpp's source text, none of which changes a split:
 * "\s+$" is written "(?<!\s)\s+$" (same leftmost match, but linear instead of
 * quadratic on long whitespace runs) and "$" is compiled DOLLAR_ENDONLY as in
 * ECMAScript. */
static const pre_def_t PRE_DEFS[] = {
    { { "deepseek-llm" },
      6,
      { "[\\r\\n]", "\\s?[" DS_LLM_LETTERS "]+",
        "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
        "(?<!\\s)\\s+$", DS_CJK, "\\p{N}+" } },
    { { "deepseek-coder" },
      5,
      { "[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", DS_CJK, "\\p{N}" } },
    { { "deepseek-v3" },
      3,
      { "\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?"
        "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { { "qwen2", "deepseek-r1-qwen" },
      1,
      { "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
        "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { { "gpt-2", "gpt2" }, 1, { GPT2_RE } },
    { { "default" }, 4, { "[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]" } },
};

#define N_PRE_DEFS (sizeof PRE_DEFS / sizeof PRE_DEFS[0])
#define MAX_RE 6

struct tok_pretok {
    const pre_def_t *def;
    int n;
    pcre2_code *re[MAX_RE];
};

static const pre_def_t *find_def(const char *name, size_t len)
{
    if (!name || len == 0)
        name = "default", len = 7;
    for (size_t i = 0; i < N_PRE_DEFS; i++)
        for (int j = 0; j < PRE_MAX_NAMES && PRE_DEFS[i].names[j]; j++)
            if (strlen(PRE_DEFS[i].names[j]) == len && memcmp(PRE_DEFS[i].names[j], name, len) == 0)
                return &PRE_DEFS[i];
    return NULL;
}

void tok_pretok_free(tok_pretok_t *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

ecs_err_t tok_pretok_new(const char *name, size_t name_len, tok_pretok_t **out)
{
    *out = NULL;
    const pre_def_t *def = find_def(name, name_len);
    if (!def)
        return ecs_error(ECS_ERR_UNSUPPORTED, "tokenizer: unknown pre-tokenizer '%.*s'",
                         (int)(name_len > 64 ? 64 : name_len), name);
    tok_pretok_t *p = calloc(1, sizeof *p);
    if (!p)
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory");
    p->def = def;
    for (int i = 0; i < def->n_re; i++) {
        int code;
        PCRE2_SIZE off;
        p->re[i] = pcre2_compile((PCRE2_SPTR)def->re[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &code, &off, NULL);
        if (!p->re[i]) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(code, msg, sizeof msg);
            tok_pretok_free(p);
            return ecs_error(ECS_ERR_INTERNAL, "tokenizer: regex %d of '%s' does not compile at %zu: %s",
                             i, def->names[0], (size_t)off, (const char *)msg);
        }
        p->n = i + 1;
        /* JIT is an optimisation only; without it the interpreter runs. */
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);
    }
    *out = p;
    return ECS_OK;
}

const char *tok_pretok_name(const tok_pretok_t *p) { return p->def->names[0]; }

/* ---- splitting ---- */

/* llama.cpp's whitespace set beyond ASCII (Unicode White_Space). */
static bool is_wide_space(uint32_t cp)
{
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

typedef struct {
    const tok_pretok_t *p;
    const char *subj;    /* text as the regexes see it */
    const uint32_t *map; /* subject offset -> text offset; NULL when identical */
    const char *text;
    pcre2_match_data *md;
    tok_word_fn fn;
    void *ud;
} split_ctx_t;

/* Builds the subject with non-ASCII whitespace replaced by U+000B. */
static ecs_err_t make_subject(const char *text, size_t len, char **subj, uint32_t **map,
                              size_t *subj_len)
{
    const uint8_t *s = (const uint8_t *)text;
    size_t i = 0;
    bool any = false;
    *subj = NULL;
    *map = NULL;
    *subj_len = len;
    while (i < len && !any) {
        uint32_t cp = s[i];
        size_t k = cp < 0x80 ? 1 : tok_u8_lenient(s + i, len - i, &cp);
        any = k > 1 && is_wide_space(cp);
        i += k ? k : 1;
    }
    if (!any)
        return ECS_OK;
    char *d = malloc(len + 1);
    uint32_t *m = malloc((len + 1) * sizeof *m);
    if (!d || !m) {
        free(d);
        free(m);
        return ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory splitting %zu bytes", len);
    }
    size_t o = 0;
    for (i = 0; i < len;) {
        uint32_t cp = s[i];
        size_t k = cp < 0x80 ? 1 : tok_u8_lenient(s + i, len - i, &cp);
        if (k == 0)
            k = 1; /* cannot happen on sanitized text; keep the byte */
        if (k > 1 && is_wide_space(cp)) {
            m[o] = (uint32_t)i;
            d[o++] = 0x0B;
        } else {
            for (size_t j = 0; j < k; j++) {
                m[o] = (uint32_t)(i + j);
                d[o++] = (char)s[i + j];
            }
        }
        i += k;
    }
    m[o] = (uint32_t)len;
    d[o] = '\0';
    *subj = d;
    *map = m;
    *subj_len = o;
    return ECS_OK;
}

/* Runs regex `level` over subject[a..b); the code point at offset `at` is
 * skipped when a regex matches the empty string there. */
static int run_match(const split_ctx_t *c, int level, size_t a, size_t b, size_t at)
{
    const pcre2_code *re = c->p->re[level];
    PCRE2_SPTR s = (PCRE2_SPTR)(c->subj + a);
    int rc = pcre2_match(re, s, b - a, at, PCRE2_NO_UTF_CHECK, c->md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(re, s, b - a, at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
    return rc;
}

static ecs_err_t split_piece(split_ctx_t *c, int level, size_t a, size_t b);

static ecs_err_t split_level(split_ctx_t *c, int level, size_t a, size_t b)
{
    size_t n = b - a, pos = 0, prev = 0;
    ecs_err_t err;
    while (pos < n) {
        int rc = run_match(c, level, a, b, pos);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ecs_error(ECS_ERR_INTERNAL, "tokenizer: pre-tokenizer '%s' regex %d failed: %s",
                             tok_pretok_name(c->p), level, (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* empty match: produces no piece, step over one code point */
            uint8_t lead = (uint8_t)c->subj[a + ms];
            pos = ms + (lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4);
            continue;
        }
        if (ms > prev && (err = split_piece(c, level + 1, a + prev, a + ms)))
            return err;
        if ((err = split_piece(c, level + 1, a + ms, a + me)))
            return err;
        prev = pos = me;
    }
    if (prev < n)
        return split_piece(c, level + 1, a + prev, b);
    return ECS_OK;
}

static ecs_err_t split_piece(split_ctx_t *c, int level, size_t a, size_t b)
{
    if (level < c->p->n)
        return split_level(c, level, a, b);
    size_t oa = c->map ? c->map[a] : a, ob = c->map ? c->map[b] : b;
    return c->fn(c->ud, c->text + oa, ob - oa);
}

ecs_err_t tok_pretok_split(const tok_pretok_t *p, const char *text, size_t len, tok_word_fn fn,
                           void *ud)
{
    if (len == 0)
        return ECS_OK;
    if (len > TOK_MAX_TEXT)
        return ecs_error(ECS_ERR_RANGE, "tokenizer: text of %zu bytes is too long", len);
    char *subj;
    uint32_t *map;
    size_t m;
    ecs_err_t err = make_subject(text, len, &subj, &map, &m);
    if (err)
        return err;
    split_ctx_t c = { p, subj ? subj : text, map, text, NULL, fn, ud };
    c.md = pcre2_match_data_create(4, NULL);
    if (!c.md) {
        err = ecs_error(ECS_ERR_NOMEM, "tokenizer: out of memory for regex match data");
    } else {
        err = split_piece(&c, 0, 0, m);
    }
    pcre2_match_data_free(c.md);
    free(subj);
    free(map);
    return err;
}
