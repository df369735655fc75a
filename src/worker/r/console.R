# The R driver, part 3 of 5: what a console gives besides running code:
# input, help as text, inspect and completion.

# ------------------------------------------------------------------ input

# Next line of input for the cell: lines of an earlier answer first, then a
# fenced input_request and a wait for the server's `input` request. NULL on
# end of input.
input_line <- function(prompt = '') {
  prompt <- paste(as.character(prompt), collapse = '')
  if (length(state$stdin_lines)) {
    line <- state$stdin_lines[1L]
    state$stdin_lines <- state$stdin_lines[-1L]
    cat(prompt, line, '\n', sep = '')
    return(line)
  }
  send_fenced(list(ev = 'input_request', cell = state$cell, prompt = cap_text(prompt), password = FALSE))
  reply <- wait_input()
  if (isTRUE(reply$eof)) {
    cat(prompt, '\n', sep = '')
    return(NULL)
  }
  text <- if (is.null(reply$text)) '' else paste(as.character(reply$text), collapse = '\n')
  lines <- strsplit(text, '\n', fixed = TRUE)[[1L]]
  if (!length(lines)) lines <- ''
  lines <- sub('\r$', '', lines)
  cat(prompt, lines[1L], '\n', sep = '')
  state$stdin_lines <- lines[-1L]
  lines[1L]
}

wait_input <- function() {
  repeat {
    line <- poll_line()
    msg <- parse_request(line)
    if (is.null(msg)) next
    if (identical(msg$op, 'input')) return(msg)
    if (identical(msg$op, 'exec')) {
      state$queue[[length(state$queue) + 1L]] <- line
    } else if (!is.null(msg$id)) {
      suspendInterrupts(handle_control(msg))
    }
  }
}

is_stdin <- function(con) {
  if (is.character(con)) return(length(con) == 1L && identical(con, 'stdin'))
  if (!inherits(con, 'connection')) return(FALSE)
  desc <- tryCatch(summary(con)$description, error = function(e) '')
  identical(desc, 'stdin')
}

make_readline <- function() function(prompt = '') {
  line <- input_line(prompt)
  if (is.null(line)) '' else line
}

make_readLines <- function(orig) {
  force(orig)
  function(con = stdin(), n = -1L, ok = TRUE, warn = TRUE, encoding = 'unknown', skipNul = FALSE) {
    if (!is_stdin(con))
      return(orig(con = con, n = n, ok = ok, warn = warn, encoding = encoding, skipNul = skipNul))
    if (inherits(con, 'connection') && as.integer(con) != 0L && !isOpen(con)) on.exit(close(con))
    n <- as.integer(n)
    out <- character(0)
    while (n < 0L || length(out) < n) {
      line <- input_line('')
      if (is.null(line)) break
      out <- c(out, line)
    }
    out
  }
}

count_items <- function(lines, sep) {
  if (!length(lines)) return(0L)
  text <- paste(lines, collapse = '\n')
  parts <- if (!is.character(sep) || !nzchar(sep[1L])) strsplit(trimws(text), '[[:space:]]+')[[1L]]
           else strsplit(gsub('\n', sep[1L], text, fixed = TRUE), sep[1L], fixed = TRUE)[[1L]]
  sum(nzchar(parts))
}

make_scan <- function(orig) {
  force(orig)
  f <- function() {
    if (!missing(text) || !(identical(file, '') || is_stdin(file))) {
      mc <- match.call()
      mc[[1L]] <- orig
      return(eval(mc, parent.frame()))
    }
    limit <- max(if (n > 0) n else 0, if (nmax > 0) nmax else 0)
    lines <- character(0)
    repeat {
      if (nlines > 0 && length(lines) >= nlines) break
      if (limit > 0 && count_items(lines, sep) >= limit) break
      line <- input_line(sprintf('%d: ', length(lines) + 1L))
      if (is.null(line) || !nzchar(trimws(line))) break
      lines <- c(lines, line)
    }
    mc <- match.call()
    mc[[1L]] <- orig
    mc$file <- NULL  # scan() reads text= only when file is missing
    mc$text <- lines
    eval(mc, parent.frame())
  }
  formals(f) <- formals(orig)
  f
}

make_menu <- function() function(choices, graphics = FALSE, title = NULL) {
  if (!length(choices)) return(0L)
  if (!is.null(title)) cat(title, '\n\n', sep = '')
  cat(paste0(format(seq_along(choices)), ': ', choices), sep = '\n')
  cat('\n')
  answer <- input_line('Selection: ')
  pick <- suppressWarnings(as.integer(trimws(if (is.null(answer)) '' else answer)))
  if (is.na(pick) || pick < 1L || pick > length(choices)) 0L else pick
}

make_browser <- function() function(text = '', condition = NULL, expr = TRUE, skipCalls = 0L) {
  if (!isTRUE(expr)) return(invisible())
  stop("browser() needs an interactive R console, which ferrepl cannot serve; use print(), str() or traceback-style messages instead",
       call. = FALSE)
}

# install.packages() without a mirror: R's own stops with "trying to use
# CRAN without setting a mirror", and a session reaches no network anyway
# (its installs run as r_install jobs, through ferrepl's proxy): say what
# to call instead. A repos of the caller's (a mirror, or NULL for local
# files) or a contriburl goes to R's own.
make_install_packages <- function(original) function(pkgs, lib, repos = getOption('repos'), ...) {
  call <- match.call()
  if (is.null(repos) || 'contriburl' %in% names(call) || !any(repos == '@CRAN@')) {
    call[[1L]] <- original
    return(eval(call, parent.frame()))
  }
  wanted <- if (!missing(pkgs) && is.character(pkgs) && length(pkgs)) pkgs else 'NAME'
  stop(sprintf(paste0('install.packages() has no CRAN mirror here, and R sessions reach no network: ',
                      'install R packages with the r_install tool: r_install {"packages": [%s]}. ',
                      'It installs into the workspace library (.ferrepl/r-library), which library() ',
                      'finds in every R session at once.'),
               paste0('"', wanted, '"', collapse = ', ')),
       call. = FALSE)
}

# closeAllConnections() as in base, minus the driver's own connections.
make_close_all <- function() function() {
  i <- sink.number(type = 'message')
  if (i > 0L) sink(stderr(), type = 'message')
  n <- sink.number()
  if (n > 0L) for (j in seq_len(n)) sink()
  set <- getAllConnections()
  set <- setdiff(set[set > 2L], driver_connections())
  for (j in set) try(close(getConnection(j)), silent = TRUE)
  invisible()
}

rebind <- function(name, value, pkg = 'base') {
  envs <- if (pkg == 'base') list(baseenv(), .BaseNamespaceEnv)
          else list(asNamespace(pkg), tryCatch(as.environment(paste0('package:', pkg)), error = function(e) NULL))
  for (env in envs) {
    if (is.null(env) || !exists(name, envir = env, inherits = FALSE)) next
    locked <- bindingIsLocked(name, env)
    if (locked) unlockBinding(name, env)
    assign(name, value, envir = env)
    if (locked) lockBinding(name, env)
  }
}

# ------------------------------------------------------------------ help

pager <- function(files, header = '', title = '', delete.file = FALSE) {
  header <- rep_len(as.character(header), length(files))
  for (i in seq_along(files)) {
    if (!is.na(header[i]) && nzchar(header[i])) cat(header[i], '\n', sep = '')
    lines <- tryCatch(readLines(files[i], warn = FALSE), error = function(e) character(0))
    # Overstrike sequences (x\bx bold, _\bx underline) read badly as plain text.
    if (any(grepl('\b', lines, fixed = TRUE))) lines <- gsub('.\b', '', lines)
    cat(lines, sep = '\n')
    if (length(lines)) cat('\n')
  }
  if (isTRUE(delete.file)) unlink(files)
  invisible()
}

no_browser <- function(url, ...) {
  cat('no browser in ferrepl: ', url, '\n', sep = '')
  invisible()
}

# edit(), fix() and file.edit() would start vi on a pipe.
no_editor <- function(name = NULL, file = '', title = NULL, ...) {
  files <- file[nzchar(file)]
  cat('no editor in ferrepl', if (length(files)) paste0(': ', paste(files, collapse = ', ')), '\n', sep = '')
  invisible(name)
}

# PDFs (RShowDoc(), vignettes) open through options(pdfviewer), which R runs
# in the background: its note may arrive after the cell's end.
pdf_viewer_script <- function() {
  path <- file.path(tempdir(), 'ferrepl-no-pdf-viewer')
  ok <- tryCatch({
    writeLines(c('#!/bin/sh', 'echo "no PDF viewer in ferrepl: $*"'), path)
    Sys.chmod(path, '755')
    TRUE
  }, error = function(e) FALSE, warning = function(w) FALSE)
  if (ok) path else 'false'
}

# ------------------------------------------------------------------ inspect and complete

MAX_REPR <- 2000L

one_line <- function(x, limit = 120L) {
  s <- tryCatch(utils::capture.output(utils::str(x, give.attr = FALSE, vec.len = 3L))[1L],
                error = function(e) sprintf('<%s>', class(x)[1L]))
  if (is.na(s)) s <- ''
  s <- gsub('[[:space:]]+', ' ', trimws(s))
  if (nchar(s) > limit) paste0(substr(s, 1L, limit - 3L), '...') else s
}

bounded <- function(lines, limit = MAX_REPR) {
  s <- paste(lines, collapse = '\n')
  if (nchar(s) > limit) paste0(substr(s, 1L, limit), '\n[... truncated]') else s
}

describe <- function(name, x) {
  item <- list(name = name, type = class(x)[1L], repr = one_line(x))
  if (!is.function(x) && !is.environment(x)) item$len <- length(x)
  d <- dim(x)
  if (!is.null(d)) item$shape <- I(as.numeric(d))
  item
}

# Names an inspect request may use: a name, or $, [[ or @ access on one.
safe_access <- function(e) {
  if (is.name(e)) return(TRUE)
  if (!is.call(e) || !is.name(e[[1L]])) return(FALSE)
  op <- as.character(e[[1L]])
  if (op %in% c('$', '@') && length(e) == 3L)
    return(safe_access(e[[2L]]) && (is.name(e[[3L]]) || is.character(e[[3L]])))
  if (op == '[[' && length(e) == 3L)
    return(safe_access(e[[2L]]) && (is.character(e[[3L]]) || is.numeric(e[[3L]])) && length(e[[3L]]) == 1L)
  FALSE
}

root_name <- function(e) if (is.name(e)) as.character(e) else root_name(e[[2L]])

inspect <- function(msg) suppressMessages({
  op <- options(max.print = 500L, warn = -1L)
  on.exit(options(op))
  name <- msg$name
  if (is.null(name)) {
    env <- globalenv()
    vars <- lapply(ls(env), function(n) {
      x <- tryCatch(get(n, envir = env), error = function(e) NULL)
      describe(n, x)
    })
    return(list(ok = TRUE, variables = I(vars)))
  }
  name <- as.character(name)[1L]
  expr <- tryCatch(parse(text = name, keep.source = FALSE), error = function(e) NULL)
  if (length(expr) != 1L || !safe_access(expr[[1L]]))
    return(list(ok = FALSE, message = sprintf("'%s' is not a name or a $, [[ or @ access on a name", name)))
  expr <- expr[[1L]]
  root <- root_name(expr)
  if (!exists(root, envir = globalenv()))
    return(list(ok = FALSE, message = sprintf("object '%s' is not defined in this session", root)))
  x <- tryCatch(list(eval(expr, globalenv())), error = function(e) e)
  if (inherits(x, 'error'))
    return(list(ok = FALSE, message = sprintf("cannot evaluate '%s': %s", name, conditionMessage(x))))
  x <- x[[1L]]
  detail <- describe(name, x)
  detail$repr <- bounded(tryCatch(utils::capture.output(print_value(x)),
                                  error = function(e) sprintf('<print failed: %s>', conditionMessage(e))))
  detail$str <- bounded(tryCatch(utils::capture.output(utils::str(x)),
                                 error = function(e) sprintf('<str failed: %s>', conditionMessage(e))))
  if (is.function(x)) {
    a <- tryCatch(deparse(args(x)), error = function(e) NULL)
    if (length(a) > 1L) a <- a[-length(a)]
    detail$signature <- if (is.null(a)) NULL else paste(trimws(a), collapse = ' ')
  }
  detail['doc'] <- list(NULL)
  list(ok = TRUE, detail = detail)
})

MAX_COMPLETIONS <- 200L

completion_kind <- function(text) {
  if (grepl('=$', text)) return('argument')
  if (!grepl('^[.[:alnum:]_]+$', text)) return('other')
  if (exists(text, envir = globalenv(), mode = 'function')) 'function'
  else if (exists(text, envir = globalenv())) 'variable'
  else 'other'
}

complete <- function(msg) {
  code <- if (is.null(msg$code)) '' else as.character(msg$code)[1L]
  cursor <- if (is.null(msg$cursor)) nchar(code) else max(0L, min(as.integer(msg$cursor), nchar(code)))
  before <- substr(code, 1L, cursor)
  line <- sub('^.*\n', '', before)
  u <- asNamespace('utils')
  u$.assignLinebuffer(line)
  u$.assignEnd(nchar(line))
  token <- u$.guessTokenFromLine()
  u$.completeToken()
  comps <- u$.retrieveCompletions()
  comps <- comps[seq_len(min(length(comps), MAX_COMPLETIONS))]
  items <- lapply(comps, function(t) list(text = t, kind = completion_kind(t)))
  list(ok = TRUE, engine = 'rcompgen', token = token, completions = I(items))
}

