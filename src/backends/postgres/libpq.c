/* libpq.c -- loads libpq on the first postgres:// client (pg.h says why).
 *
 * The rest of the backend calls libpq through dlock__pq, a table filled
 * here by dlock__dl_load(): a program that never opens a postgres://
 * client never maps libpq nor what libpq links (OpenSSL, Kerberos, LDAP).
 */
#include "pg.h"

struct dlock__pq_api dlock__pq;

int dlock__pq_load(void)
{
    static const struct dlock__dl_sym syms[] = {
#define SYM(field, name) {(void **)&dlock__pq.field, name}
        SYM(connectdb, "PQconnectdb"),
        SYM(exec, "PQexec"),
        SYM(connectStartParams, "PQconnectStartParams"),
        SYM(connectPoll, "PQconnectPoll"),
        SYM(status, "PQstatus"),
        SYM(errorMessage, "PQerrorMessage"),
        SYM(finish, "PQfinish"),
        SYM(socket, "PQsocket"),
        SYM(sendQuery, "PQsendQuery"),
        SYM(consumeInput, "PQconsumeInput"),
        SYM(isBusy, "PQisBusy"),
        SYM(getResult, "PQgetResult"),
        SYM(resultStatus, "PQresultStatus"),
        SYM(resultErrorField, "PQresultErrorField"),
        SYM(resultErrorMessage, "PQresultErrorMessage"),
        SYM(clear, "PQclear"),
        SYM(ntuples, "PQntuples"),
        SYM(getvalue, "PQgetvalue"),
        SYM(getisnull, "PQgetisnull"),
        SYM(getCancel, "PQgetCancel"),
        SYM(freeCancel, "PQfreeCancel"),
        SYM(cancel, "PQcancel"),
        SYM(backendPID, "PQbackendPID"),
        SYM(setNoticeProcessor, "PQsetNoticeProcessor"),
        SYM(notifies, "PQnotifies"),
        SYM(freemem, "PQfreemem"),
#undef SYM
    };
    static struct dlock__dl_lib lib =
        DLOCK__DL_LIB("libpq.so.5", "the postgres backend", "libpq5", syms, NULL);
    return dlock__dl_load(&lib);
}
