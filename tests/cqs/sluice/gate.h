/* Test shim: <sluice/gate.h> resolved to gate v2 (sluice/gate_cqs.h), so the
 * gate tests build a second time, unchanged, against it (tests/CMakeLists.txt). */
#include <sluice/gate_cqs.h>
