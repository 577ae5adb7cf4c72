/*
 * Preloaded into a worker by test_llama: llama.cpp reporting another version, to check that
 * the integration refuses a build whose state layout it does not know.
 */
__attribute__((visibility("default"))) const char *llama_version(void);

const char *llama_version(void)
{
    return "0.6.0-other";
}
