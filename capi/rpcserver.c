/* librpcserver: the existing library's name and its functions (rpcserver.h), each one call into
 * libspecrpc, whose own exports are all specrpc_* (specrpc.h). An application built against the
 * existing library links or loads this one and works unchanged. */
#include "specrpc/rpcserver.h"
#include "specrpc/specrpc.h"

int init(const char * cmd) { return specrpc_init(cmd); }
void init_async(const char * cmd) { specrpc_init_async(cmd); }
const char * poll_system_status(void) { return specrpc_poll_system_status(); }
const char * tokenize(const char * req) { return specrpc_tokenize(req); }
const char * get_completion(const char * req) { return specrpc_get_completion(req); }
const char * async_completion_init(const char * req) { return specrpc_async_completion_init(req); }
const char * async_completion_poll(const char * cmd) { return specrpc_async_completion_poll(cmd); }
const char * async_completion_cancel(const char * req) { return specrpc_async_completion_cancel(req); }
void deinit(void) { specrpc_deinit(); }
