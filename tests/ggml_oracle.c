/* ggml's own quantizers as an oracle for kvbench's ggml formats (tests/test_ggml_oracle.py).
 *
 * Built against the ggml static libraries of the llama.cpp build in kvbench's cache. Reads
 * from stdin: the type name, the quantizer ("ref": ggml-base's quantize_row_<type>_ref, what
 * gguf files are made with; "cpu": ggml-cpu's from_float, what llama.cpp's KV-cache writes
 * call), the row length k and the row count n (text, one line), then n * k float32 values
 * (little-endian binary). Writes the n rows' blocks to stdout, each row quantized by one call.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

/* ggml-quants.h is internal to ggml; these are its exported reference quantizers */
void quantize_row_q4_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_0_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_1_ref(const float *x, void *y, int64_t k);
void quantize_row_q8_0_ref(const float *x, void *y, int64_t k);
void quantize_row_iq4_nl_ref(const float *x, void *y, int64_t k);

typedef void (*quantize_fn)(const float *x, void *y, int64_t k);

static const struct {
    const char *name;
    enum ggml_type type;
    quantize_fn ref;
} TYPES[] = {
    {"q4_0", GGML_TYPE_Q4_0, quantize_row_q4_0_ref},
    {"q4_1", GGML_TYPE_Q4_1, quantize_row_q4_1_ref},
    {"q5_0", GGML_TYPE_Q5_0, quantize_row_q5_0_ref},
    {"q5_1", GGML_TYPE_Q5_1, quantize_row_q5_1_ref},
    {"q8_0", GGML_TYPE_Q8_0, quantize_row_q8_0_ref},
    {"iq4_nl", GGML_TYPE_IQ4_NL, quantize_row_iq4_nl_ref},
};

int main(void) {
    char name[16], mode[8];
    long k, n;
    if (scanf("%15s %7s %ld %ld", name, mode, &k, &n) != 4 || getchar() != '\n') {
        fprintf(stderr, "usage: <type> <ref|cpu> <k> <n>\\n then n*k float32\n");
        return 2;
    }
    int t = -1;
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (!strcmp(name, TYPES[i].name)) t = (int)i;
    if (t < 0 || (strcmp(mode, "ref") && strcmp(mode, "cpu"))) {
        fprintf(stderr, "unknown type %s or mode %s\n", name, mode);
        return 2;
    }
    ggml_cpu_init();
    quantize_fn fn = TYPES[t].ref;
    if (!strcmp(mode, "cpu")) fn = ggml_get_type_traits_cpu(TYPES[t].type)->from_float;
    size_t row_bytes = ggml_row_size(TYPES[t].type, k);
    float *x = malloc(sizeof(float) * k);
    void *y = malloc(row_bytes);
    for (long r = 0; r < n; r++) {
        if (fread(x, sizeof(float), k, stdin) != (size_t)k) {
            fprintf(stderr, "short input at row %ld\n", r);
            return 2;
        }
        memset(y, 0, row_bytes);
        fn(x, y, k);
        fwrite(y, 1, row_bytes, stdout);
    }
    free(x);
    free(y);
    return 0;
}
