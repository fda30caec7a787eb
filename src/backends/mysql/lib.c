/* lib.c -- loads libmariadb on first use (mysql.h says why), so a
 * program on another backend never maps it.
 */
#include "mysql.h"

struct dlock__mariadb_api dlock__mariadb;

static void library_init(void)
{
    dlock__mariadb.library_init(0, NULL, NULL);
}

int dlock__mariadb_load(void)
{
    static const struct dlock__dl_sym syms[] = {
#define SYM(field, name) {(void **)&dlock__mariadb.field, name}
        SYM(library_init, "mysql_server_init"),
        SYM(init, "mysql_init"),
        SYM(optionsv, "mysql_optionsv"),
        SYM(real_connect_start, "mysql_real_connect_start"),
        SYM(real_connect_cont, "mysql_real_connect_cont"),
        SYM(real_query_start, "mysql_real_query_start"),
        SYM(real_query_cont, "mysql_real_query_cont"),
        SYM(store_result_start, "mysql_store_result_start"),
        SYM(store_result_cont, "mysql_store_result_cont"),
        SYM(more_results, "mysql_more_results"),
        SYM(next_result_start, "mysql_next_result_start"),
        SYM(next_result_cont, "mysql_next_result_cont"),
        SYM(fetch_row, "mysql_fetch_row"),
        SYM(fetch_lengths, "mysql_fetch_lengths"),
        SYM(num_fields, "mysql_num_fields"),
        SYM(free_result, "mysql_free_result"),
        SYM(close, "mysql_close"),
        SYM(error, "mysql_error"),
        SYM(errno_, "mysql_errno"),
        SYM(get_socket, "mysql_get_socket"),
        SYM(get_timeout_value_ms, "mysql_get_timeout_value_ms"),
        SYM(thread_id, "mysql_thread_id"),
        SYM(insert_id, "mysql_insert_id"),
        SYM(affected_rows, "mysql_affected_rows"),
        SYM(real_connect, "mysql_real_connect"),
        SYM(real_query, "mysql_real_query"),
        SYM(store_result, "mysql_store_result"),
#undef SYM
    };
    static struct dlock__dl_lib lib =
        DLOCK__DL_LIB("libmariadb.so.3", "the mysql backend", "libmariadb3", syms, library_init);
    return dlock__dl_load(&lib);
}
