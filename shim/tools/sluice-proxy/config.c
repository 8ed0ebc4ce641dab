#define _GNU_SOURCE
#include "proxy.h"
int config_load(const char *path, struct options *o)
{
    (void)o;
    return usage_error("--config %s: not yet", path);
}
