/* commands.h: the subcommands of `focus`, one file each (cmd_NAME.c), listed in main.c's table.
 * Each takes the arguments after `focus` (argv[0] is the command's name) and returns the exit
 * status. */
#ifndef FOCUS_COMMANDS_H
#define FOCUS_COMMANDS_H

int cmd_retrofit(int argc, char** argv);
int cmd_groups(int argc, char** argv);
int cmd_finetune(int argc, char** argv);
int cmd_pretrain(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_prepare(int argc, char** argv);
int cmd_eval(int argc, char** argv);
int cmd_eval_tasks(int argc, char** argv);   /* eval tasks */
int cmd_eval_passkey(int argc, char** argv); /* eval passkey */
int cmd_eval_curve(int argc, char** argv);   /* eval curve */
int cmd_generate(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_bench_decode(int argc, char** argv); /* bench decode */
int cmd_settings(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_export(int argc, char** argv);
int cmd_average(int argc, char** argv);
int cmd_fitblocks(int argc, char** argv);

#endif
