/* cmd_settings.c: `focus settings`, every setting of a run, from the tables that parse them. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "../train/runconfig.h"

int cmd_settings(int argc, char** argv) {
    if (argc > 1 && !strcmp(argv[1], "--methods")) { /* the README's table */
        attn_methods_help(stdout, 1);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--help"))
        fatal("settings: the only option is --methods (got '%s')", argv[1]);
    printf("settings of configs/*.conf ([section] name = value) and of --set name=value:\n");
    printf("  %-8s %-16s %-10s %s\n", "section", "name", "default", "meaning");
    runconfig_help(stdout);
    printf(
        "\nattention methods (attn = NAME; eval --modes NAME:BUDGET, the budget setting's "
        "value):\n");
    attn_methods_help(stdout, 0);
    return 0;
}
