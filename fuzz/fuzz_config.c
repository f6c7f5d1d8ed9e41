/* fuzz_config.c: run settings files (train/runconfig.c, the settings table) on arbitrary text:
 * parsed, then checked as a run would check them, then written back as a run's configuration
 * text, which must parse again to the same text. */
#include <stdlib.h>
#include <string.h>

#include "../train/runconfig.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static char* text;
    static char *once, *twice;
    text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    once = twice = NULL;
    FUZZ_TRY({
        RunConfig rc;
        runconfig_default(&rc);
        runconfig_load_text(&rc, text, "fuzz.conf");
        config_validate(&rc.mcfg, &rc.fc);
        once = runconfig_text(&rc);
        RunConfig back;
        runconfig_default(&back);
        runconfig_load_text(&back, once, "written back");
        twice = runconfig_text(&back);
        if (strcmp(once, twice)) abort(); /* the written text must read back to itself */
    });
    free(text);
    free(once);
    free(twice);
    return 0;
}
