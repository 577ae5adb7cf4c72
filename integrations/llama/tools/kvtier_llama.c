/*
 * kvtier-llama: kvtier as llama.cpp's persistent prompt cache, shown and measured.
 *   demo       a real conversation, the process restarted, the prefix restored from disk
 *   bench      save and restore of an 8k-token context against same-run device limits
 *   gen-model  write a generated random-weight GGUF model
 *   serve      an OpenAI-compatible server whose prompt cache is kvtier (docs/SERVE.md)
 */
#include <stdio.h>
#include <string.h>

#include "cmds.h"
#include "model_gen.h"
#include "serve.h"

static int gen_model(int argc, char **argv)
{
    struct model_spec m;
    if (argc != 3 || !model_spec_named(argv[1], &m)) {
        fprintf(stderr,
                "usage: kvtier-llama gen-model llama|qwen3|gemma2|mamba|chat|demo|chat-demo "
                "OUT.gguf\n");
        return 2;
    }
    return model_write(&m, argv[2]) ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "demo") == 0)
        return cmd_llama_demo(argc - 1, argv + 1);
    if (strcmp(cmd, "demo-turns") == 0)
        return cmd_llama_demo_turns(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0)
        return cmd_llama_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "gen-model") == 0)
        return gen_model(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    fprintf(stderr,
            "usage: kvtier-llama demo [--dir D] [--model M]\n"
            "       kvtier-llama bench [--dir D] [--model M] [--tokens N] [--repeat R] "
            "[--json]\n"
            "       kvtier-llama gen-model llama|qwen3|gemma2|mamba|chat|demo|chat-demo "
            "OUT.gguf\n"
            "       kvtier-llama serve -m MODEL.gguf --cache-dir DIR [--port N] [--slots N] "
            "...\n");
    return 2;
}
