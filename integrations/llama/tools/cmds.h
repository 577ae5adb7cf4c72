/* The subcommands of kvtier-llama. Each returns the process exit status (2: usage). */
#ifndef KVT_LLAMA_CMDS_H
#define KVT_LLAMA_CMDS_H

int cmd_llama_demo(int argc, char **argv);
/* One process of the demo (run by cmd_llama_demo, not by hand). */
int cmd_llama_demo_turns(int argc, char **argv);
int cmd_llama_bench(int argc, char **argv);

#endif
