/*
 * sluice/status.h — status codes for every sluice call.
 *
 * One X-macro map generates the enum, sluice_strerror() and
 * sluice_status_name(), libuv-style. Values are negative errno where one
 * exists, so a status can be compared against -errno; codes with no errno
 * equivalent live at -4000 and below. SLUICE_EINVAL from a create, init or
 * validate comes with a message in the description's `error` buffer
 * (sluice__fail below).
 *
 * Concurrency: pure functions over constant tables; callable from any thread.
 */
#ifndef SLUICE_STATUS_H
#define SLUICE_STATUS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "cc.h"

/* X(NAME, value, message) */
#define SLUICE_STATUS_MAP(X)                                                                       \
    X(OK, 0, "success")                                                                            \
    X(EAGAIN, -EAGAIN, "resource temporarily unavailable")                                         \
    X(ETIMEDOUT, -ETIMEDOUT, "deadline expired before the operation completed")                    \
    X(ECANCELED, -ECANCELED, "operation canceled")                                                 \
    X(EINVAL, -EINVAL, "invalid argument or configuration")                                        \
    X(ENOMEM, -ENOMEM, "out of memory")                                                            \
    X(EIO, -EIO, "input/output error")                                                             \
    X(ECAPACITY, -4000, "capacity full: no admission slot is free")                                \
    X(ECLOSED, -4001, "closed: the object no longer accepts waiters")                              \
    X(ECLIENT, -4002, "a client callback failed (its own code is in the result)")                 \
    X(ELATE, -4003, "refused at admission: the predicted wait leaves too little of the deadline")

enum sluice_status {
#define SLUICE__STATUS_ENUM(name, value, msg) SLUICE_##name = (value),
    SLUICE_STATUS_MAP(SLUICE__STATUS_ENUM)
#undef SLUICE__STATUS_ENUM
};

/* A human-readable message for a status; never NULL. */
SLUICE_INLINE const char *sluice_strerror(int status)
{
    switch (status) {
#define SLUICE__STATUS_MSG(name, value, msg)                                                       \
    case (value):                                                                                  \
        return msg;
        SLUICE_STATUS_MAP(SLUICE__STATUS_MSG)
#undef SLUICE__STATUS_MSG
    default:
        return "unknown sluice status";
    }
}

/* The enumerator's name without the prefix ("ECAPACITY"); never NULL. */
SLUICE_INLINE const char *sluice_status_name(int status)
{
    switch (status) {
#define SLUICE__STATUS_NAME(name, value, msg)                                                      \
    case (value):                                                                                  \
        return #name;
        SLUICE_STATUS_MAP(SLUICE__STATUS_NAME)
#undef SLUICE__STATUS_NAME
    default:
        return "UNKNOWN";
    }
}

/*
 * Every create, init and validate reports a bad description the same way:
 * a message naming the field to change, written to the caller's buffer its
 * description passes as `error` (`error_size` bytes, NUL included), and
 * SLUICE_EINVAL. This writes it (err may be NULL or err_size 0: no message;
 * a longer one is cut, still terminated), so no module carries its own copy.
 */
SLUICE_INLINE int sluice__fail(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
SLUICE_INLINE int sluice__fail(char *err, size_t err_size, const char *fmt, ...)
{
    if (err && err_size) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_size, fmt, ap);
        va_end(ap);
    }
    return SLUICE_EINVAL;
}

#endif /* SLUICE_STATUS_H */
