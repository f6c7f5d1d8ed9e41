/* cmd_export.c: `focus export`, a trained router for sharing (the routers the project ships in
 * routers/): the router, its causal bias, state and settings without the optimizer's moments,
 * about a third of a run's router.h5. It evaluates and serves exactly like the run's file, on the
 * same base model; training cannot resume from it. */
#include <stdio.h>
#include <sys/stat.h>

#include "../checkpoints/router_h5.h"
#include "cli.h"
#include "commands.h"

static const char export_usage[] =
    "usage: focus export --model M --router RUN/router.h5 --out ROUTER.h5\n"
    "The router of a run without its optimizer moments (about a third of the size), for\n"
    "sharing: eval, passkey, curve, groups, generate and bench decode take it with --router on\n"
    "the same base model; retrofit --resume cannot continue from it.\n";

int cmd_export(int argc, char** argv) {
    const char *model = NULL, *router = NULL, *out = NULL;
    if (cli_parse("export", argc, argv, 1, export_usage, "--model:s --router:s --out:s", &model,
                  &router, &out))
        return 0;
    if (!model || !router || !out) fatal("export: needs --model, --router and --out");
    Model m;
    ModelInfo info;
    CliList sets = {0};
    cli_open_model(
        &m, &info,
        &(ModelRequest){.model = model, .router = router, .routing = "causal", .sets = &sets});
    RouterState st;
    router_load(router, &m, NULL, &st, model_fingerprint(&m)); /* the step, data position, ... */
    char* conf = router_read_config(router);
    router_save(out, &m, NULL, &st, conf);
    free(conf);
    struct stat a, b;
    if (stat(router, &a) || stat(out, &b)) fatal("export: %s: cannot stat the written file", out);
    printf("wrote %s (%.2f MB; %s: %.2f MB), the router of step %ld on %s\n", out, b.st_size / 1e6,
           router, a.st_size / 1e6, st.step, info.name);
    model_free(&m);
    return 0;
}
