# dlock.bash -- bash completion for dlock(1): commands, options, -u schemes.
#
# Options are read from `dlock help COMMAND` at completion time, so this
# file never drifts from the binary it completes (tests/check_cli.c checks
# that every command and a sample of options complete). Installed by
# `make install` as $(PREFIX)/share/bash-completion/completions/dlock.

_dlock_commands="run hold elect leader status check value get release list bench help"
_dlock_schemes="file:// redis:// rediss:// redis+unix:// redis+sentinel://
rediss+sentinel:// redis+cluster:// rediss+cluster:// redlock:// redlocks://
etcd:// etcd+https:// zk:// postgres:// postgresql:// mysql:// mariadb://"

# _dlock_options CMD: the long and short options `dlock help CMD` prints
# (hold and elect take run's options too, as their help says).
_dlock_options()
{
    local cmd=$1 dlock=${COMP_WORDS[0]}
    {
        "$dlock" help "$cmd" 2>/dev/null
        case $cmd in hold|elect) "$dlock" help run 2>/dev/null ;; esac
    } | grep -oE -- '(^|[ ,\[])--?[A-Za-z][A-Za-z-]*' | grep -oE -- '--?[A-Za-z][A-Za-z-]*' |
        sort -u
}

_dlock()
{
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local i cmd= cmd_at=0 args=0
    COMPREPLY=()

    # the command word, past the global options and -u's argument
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            -u|--url) ((i++)) ;;
            -*) ;;
            *) cmd=${COMP_WORDS[i]} cmd_at=$i; break ;;
        esac
    done

    case $prev in
        -u|--url)
            compopt -o nospace 2>/dev/null
            COMPREPLY=($(compgen -W "$_dlock_schemes" -- "$cur"))
            return ;;
        --on-lost)
            COMPREPLY=($(compgen -W "term kill ignore" -- "$cur"))
            return ;;
    esac

    if [[ -z $cmd ]]; then
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W "-u --url -h --help -V --version" -- "$cur"))
        else
            COMPREPLY=($(compgen -W "$_dlock_commands" -- "$cur"))
        fi
        return
    fi

    case $cmd in
        help)
            COMPREPLY=($(compgen -W "$_dlock_commands" -- "$cur"))
            return ;;
        run|elect)
            # after -- (or NAME and one more word), COMMAND and its arguments
            for ((i = cmd_at + 1; i < COMP_CWORD; i++)); do
                if [[ ${COMP_WORDS[i]} == -- ]]; then
                    if declare -F _command_offset >/dev/null; then
                        _command_offset $((i + 1))
                    else
                        COMPREPLY=($(compgen -c -- "$cur" | sort -u))
                    fi
                    return
                fi
            done ;;
    esac

    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$(_dlock_options "$cmd")" -- "$cur"))
    elif [[ $cur == /* || $cur == ./* || $cur == ../* ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))   # a path NAME (flock(1)'s files)
    fi
}
complete -F _dlock dlock
