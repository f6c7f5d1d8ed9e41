/* cmd_settings.c: `focus settings`, every setting of a run, from the tables that parse them. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "runconfig.h"

int cmd_settings(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--help")) fatal("settings: no options (got '%s')", argv[1]);
    printf("settings of configs/*.conf ([section] name = value) and of --set name=value:\n");
    printf("  %-8s %-16s %-10s %s\n", "section", "name", "default", "meaning");
    runconfig_help(stdout);
    return 0;
}
