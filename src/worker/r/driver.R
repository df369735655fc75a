# ferrepl's R driver. boot.R evaluates this file in a private environment
# (parent: baseenv()) and calls ferrepl_main() with fd 3 open; nothing here
# shows up in the session's global environment. Protocol: docs/protocol.md;
# R differences: requests are one R expression per line (a named list), and
# events go to fd 4 as JSON lines.
#
# SIGINT in this mode (R 4.2, `R --no-echo -e`, non-interactive): R's handler
# only sets a pending flag; at the next interrupt check R signals an
# `interrupt` condition, which tryCatch(interrupt = ) catches; uncaught, R
# prints "Execution halted" and exits. A blocking read() is restarted after
# the signal (SA_RESTART), so the flag stays pending until something checks
# it, possibly much later. Hence: the driver runs under suspendInterrupts(),
# user code under allowInterrupts() inside tryCatch(interrupt = ), a pending
# interrupt is drained (Sys.sleep(0) checks it) before each request, and
# waiting for input polls a non-blocking connection with Sys.sleep(), which
# an interrupt can end.

state <- new.env(parent = emptyenv())
state$fence <- 0L
state$cell <- 0
state$queue <- list()
state$rbuf <- raw(0)
state$stdin_lines <- character(0)
state$plot_dir <- NULL
state$dev_seq <- 0L
state$base_n <- 0L

MAX_EVENT_BYTES <- 16000000
MAX_FRAMES <- 50L
MAX_CALL_CHARS <- 200L
DRIVER_EVAL <- quote(eval(ferrepl_expr, globalenv()))
DRIVER_WITHVISIBLE <- quote(withVisible(eval(ferrepl_expr, globalenv())))
DRIVER_PRINT <- quote(print_value(vis$value))

# ------------------------------------------------------------------ JSON

JSON_CONTROLS <- setdiff(1:31, c(9L, 10L, 13L))

json_string <- function(x) {
  x <- enc2utf8(as.character(x))
  na <- is.na(x)
  bad <- !na & !validUTF8(x)
  if (any(bad)) x[bad] <- iconv(x[bad], 'UTF-8', 'UTF-8', sub = 'byte')
  x <- gsub('\\', '\\\\', x, fixed = TRUE)
  x <- gsub('"', '\\"', x, fixed = TRUE)
  if (any(grepl('[\001-\037]', x, useBytes = TRUE))) {
    x <- gsub('\n', '\\n', x, fixed = TRUE)
    x <- gsub('\r', '\\r', x, fixed = TRUE)
    x <- gsub('\t', '\\t', x, fixed = TRUE)
    for (code in JSON_CONTROLS) {
      ch <- rawToChar(as.raw(code))
      if (any(grepl(ch, x, fixed = TRUE))) x <- gsub(ch, sprintf('\\u%04x', code), x, fixed = TRUE)
    }
  }
  out <- paste0('"', x, '"')
  out[na] <- 'null'
  out
}

json_number <- function(x) {
  out <- as.character(x)
  ok <- is.finite(x)
  # Whole numbers without exponent: the server parses cell ids as integers.
  whole <- ok & x == trunc(x) & abs(x) < 1e15
  out[whole] <- sprintf('%.0f', x[whole])
  out[!ok] <- 'null'
  out
}

# NULL and NA become null; a named list an object; an unnamed list, an I()
# vector or a vector of length != 1 an array.
to_json <- function(x) {
  if (is.null(x)) return('null')
  if (is.list(x)) {
    if (!length(x)) return(if (is.null(names(x))) '[]' else '{}')
    parts <- vapply(x, to_json, '', USE.NAMES = FALSE)
    if (is.null(names(x)) || inherits(x, 'AsIs'))
      return(paste0('[', paste(parts, collapse = ','), ']'))
    return(paste0('{', paste0(json_string(names(x)), ':', parts, collapse = ','), '}'))
  }
  vals <- switch(typeof(x),
    character = json_string(x),
    logical = ifelse(is.na(x), 'null', ifelse(x, 'true', 'false')),
    integer = ,
    double = json_number(unclass(x)),
    json_string(as.character(x)))
  if (length(x) == 1L && !inherits(x, 'AsIs')) return(vals)
  paste0('[', paste(vals, collapse = ','), ']')
}

# ------------------------------------------------------------------ base64

B64_ALPHABET <- charToRaw('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/')

base64 <- function(bytes) {
  n <- length(bytes)
  if (!n) return('')
  pad <- (3L - n %% 3L) %% 3L
  m <- matrix(as.integer(c(bytes, raw(pad))), nrow = 3L)
  a <- m[1L, ]; b <- m[2L, ]; c <- m[3L, ]
  idx <- rbind(a %/% 4L, (a %% 4L) * 16L + b %/% 16L, (b %% 16L) * 4L + c %/% 64L, c %% 64L)
  out <- B64_ALPHABET[idx + 1L]
  if (pad) out[(length(out) - pad + 1L):length(out)] <- charToRaw('=')
  rawToChar(out)
}

# ------------------------------------------------------------------ transport

# Output connections are stdio-backed file() connections: fflush retries
# partial pipe writes (a signal can cut a write short), so an event line or a
# marker is never torn.
open_out <- function(fd) file(sprintf('/dev/fd/%d', fd), open = 'wb', raw = TRUE)

driver_connections <- function() {
  cons <- list(state$ev_con, state$out_con, state$err_con, state$req_bin, state$req_nb)
  nums <- vapply(cons, function(con) if (is.null(con)) NA_integer_ else as.integer(con), 0L)
  nums[!is.na(nums)]
}

# Writes bytes on one of the driver's output connections; reopens it once when
# user code closed it.
write_out <- function(key, fd, bytes) {
  attempt <- function() {
    writeBin(bytes, state[[key]])
    flush(state[[key]])
    TRUE
  }
  ok <- tryCatch(attempt(), error = function(e) FALSE)
  if (!ok) {
    ok <- tryCatch({
      state[[key]] <- open_out(fd)
      attempt()
    }, error = function(e) FALSE)
  }
  ok
}

send <- function(ev) suspendInterrupts({
  txt <- to_json(ev)
  if (nchar(txt, type = 'bytes') > MAX_EVENT_BYTES) txt <- to_json(shrink_event(ev))
  write_out('ev_con', 4L, c(charToRaw(txt), as.raw(10L)))
  invisible()
})

# An event that would exceed the size cap keeps its shape with short strings.
shrink_event <- function(ev) {
  cut <- function(s) if (is.character(s) && length(s) == 1L && nchar(s) > 10000L)
    paste0(substr(s, 1L, 10000L), '\n[... truncated: the event exceeded 16 MB]') else s
  for (k in names(ev)) ev[[k]] <- if (is.list(ev[[k]]) && !is.null(names(ev[[k]]))) lapply(ev[[k]], cut) else cut(ev[[k]])
  if (identical(ev$ev, 'display')) ev$data <- ''
  ev
}

fence <- function() {
  try(flush(stdout()), silent = TRUE)
  try(flush(stderr()), silent = TRUE)
  n <- state$fence + 1L
  state$fence <- n
  marker <- c(state$marker_prefix, charToRaw(sprintf('%016x', n)), as.raw(0L))
  fenced <- character(0)
  if (write_out('out_con', 1L, marker)) fenced <- c(fenced, 'stdout')
  if (write_out('err_con', 2L, marker)) fenced <- c(fenced, 'stderr')
  list(number = n, fenced = fenced)
}

send_fenced <- function(ev) suspendInterrupts({
  f <- fence()
  ev$fence <- f$number
  ev$fenced <- I(f$fenced)
  send(ev)
})

quit_now <- function() quit(save = 'no', status = 0, runLast = FALSE)

# The next request line, blocking. Reads in chunks (a fifo connection reads
# one byte per system call through readLines) into state$rbuf.
next_line <- function() {
  if (length(state$queue)) {
    line <- state$queue[[1L]]
    state$queue <- state$queue[-1L]
    return(line)
  }
  # A line the input poller left half read (an interrupt cut its wait short).
  if (!is.null(state$req_nb) && pushBackLength(state$req_nb) > 0L) return(poll_line(Inf))
  repeat {
    line <- buffered_line()
    if (!is.null(line)) return(line)
    chunk <- tryCatch(readBin(state$req_bin, 'raw', 65536L), error = function(e) NULL)
    if (is.null(chunk)) {
      # User code closed the connection: fd 3 itself is still open.
      state$req_bin <- fifo('/dev/fd/3', open = 'rb', blocking = TRUE)
      next
    }
    if (!length(chunk)) quit_now()
    state$rbuf <- c(state$rbuf, chunk)
  }
}

buffered_line <- function() {
  buf <- state$rbuf
  if (!length(buf)) return(NULL)
  nl <- which(buf == as.raw(10L))
  if (!length(nl)) return(NULL)
  nl <- nl[1L]
  state$rbuf <- buf[-seq_len(nl)]
  if (nl > 1L) rawToChar(buf[seq_len(nl - 1L)]) else ''
}

parse_request <- function(line) {
  msg <- tryCatch(eval(parse(text = line, keep.source = FALSE)[[1L]], baseenv()),
                  error = function(e) NULL)
  if (is.list(msg)) msg else NULL
}

parent_pid <- function() {
  stat <- tryCatch(readLines('/proc/self/stat', warn = FALSE), error = function(e) '')
  fields <- strsplit(sub('^.*\\) ', '', stat[1L]), ' ', fixed = TRUE)[[1L]]
  if (length(fields) >= 2L) suppressWarnings(as.integer(fields[2L])) else NA_integer_
}

# Waits for one line on the non-blocking twin of fd 3, sleeping between polls
# so that an interrupt can end the wait. A non-blocking read cannot tell end
# of file from no data, so a change of parent process stands for the server
# having gone away.
poll_line <- function(limit = Inf) {
  if (is.null(state$req_nb)) state$req_nb <- fifo('/dev/fd/3', open = 'r', blocking = FALSE)
  delay <- 0.0005
  since_check <- 0
  repeat {
    line <- suspendInterrupts(tryCatch(readLines(state$req_nb, n = 1L, warn = FALSE), error = function(e) {
      state$req_nb <- fifo('/dev/fd/3', open = 'r', blocking = FALSE)
      character(0)
    }))
    if (length(line)) return(line)
    Sys.sleep(delay)
    since_check <- since_check + delay
    delay <- min(delay * 1.5, 0.05)
    if (since_check > 2) {
      since_check <- 0
      ppid <- parent_pid()
      if (!is.na(ppid) && !is.na(state$ppid) && ppid != state$ppid) quit_now()
    }
  }
}

# ------------------------------------------------------------------ calls and errors

call_head <- function(call) {
  h <- call[[1L]]
  if (is.name(h)) return(as.character(h))
  if (is.call(h) && length(h) == 3L && as.character(h[[1L]]) %in% c('::', ':::'))
    return(as.character(h[[3L]]))
  ''
}

# Replaces values embedded in a call (do.call puts whole data sets there) by
# short placeholders, so deparsing stays cheap.
shrink_call <- function(x, depth = 0L) {
  if (!is.call(x) || depth > 20L) return(x)
  for (i in seq_along(x)) {
    t <- typeof(x[[i]])
    if (t == 'language') {
      x[[i]] <- shrink_call(x[[i]], depth + 1L)
    } else if (t %in% c('closure', 'builtin', 'special')) {
      x[[i]] <- as.name('<function>')
    } else if (!(t %in% c('symbol', 'NULL')) &&
               (length(x[[i]]) > 5L || !(t %in% c('logical', 'integer', 'double', 'complex', 'character')))) {
      x[[i]] <- as.name(sprintf('<%s>', class(x[[i]])[1L]))
    }
  }
  x
}

deparse_call <- function(call) {
  text <- tryCatch({
    d <- deparse(shrink_call(call), width.cutoff = 200L, nlines = 3L, backtick = FALSE)
    paste(trimws(d), collapse = ' ')
  }, error = function(e) '<call>')
  if (nchar(text) > MAX_CALL_CHARS) text <- paste0(substr(text, 1L, MAX_CALL_CHARS - 3L), '...')
  text
}

strip_attrs <- function(call) {
  attributes(call) <- NULL
  call
}

is_driver_call <- function(call) {
  call <- strip_attrs(call)
  identical(call, DRIVER_EVAL) || identical(call, DRIVER_WITHVISIBLE) || identical(call, DRIVER_PRINT)
}

SIGNAL_FRAMES <- c('stop', 'warning', '.handleSimpleError', '.signalSimpleWarning', 'signalCondition',
                   'withRestarts', 'withOneRestart', 'doWithOneRestart', 'invokeRestart')

# The user's frames of a stack captured by a calling handler: frames up to
# the driver's eval (state$base_n and the wrappers right after it), the
# handler itself and the frames that signalled the condition are dropped.
user_frames <- function(calls) {
  n <- length(calls)
  first <- state$base_n + 1L
  while (first <= n && is_driver_call(calls[[first]])) first <- first + 1L
  last <- n - 1L
  while (last >= first && call_head(calls[[last]]) %in% SIGNAL_FRAMES) last <- last - 1L
  if (last < first) return(list())
  calls[first:last]
}

srcref_note <- function(call) {
  sr <- attr(call, 'srcref')
  if (is.null(sr)) return('')
  file <- tryCatch(attr(sr, 'srcfile')$filename, error = function(e) NULL)
  if (is.null(file) || !nzchar(file)) return('')
  sprintf(' at %s:%d', file, sr[1L])
}

format_backtrace <- function(frames) {
  n <- length(frames)
  if (!n) return(character(0))
  keep <- seq_len(n)
  if (n > MAX_FRAMES) keep <- c(seq_len(MAX_FRAMES %/% 2L), (n - MAX_FRAMES %/% 2L + 1L):n)
  lines <- vapply(keep, function(i) sprintf('%3d. %s%s', i, deparse_call(frames[[i]]), srcref_note(frames[[i]])), '')
  if (n > MAX_FRAMES) {
    half <- MAX_FRAMES %/% 2L
    lines <- c(lines[seq_len(half)], sprintf('     ... %d frames omitted ...', n - MAX_FRAMES), lines[-seq_len(half)])
  }
  c('Backtrace:', lines)
}

condition_call <- function(cond) {
  call <- tryCatch(conditionCall(cond), error = function(e) NULL)
  if (!is.call(call) || is_driver_call(call)) NULL else call
}

cap_text <- function(s, limit = state$max_value_chars) {
  if (nchar(s, allowNA = TRUE, type = 'chars') %in% NA) return(s)
  if (nchar(s) > limit) paste0(substr(s, 1L, limit), sprintf('... [%d more characters]', nchar(s) - limit)) else s
}

error_info <- function(cond, calls) {
  message <- tryCatch(conditionMessage(cond), error = function(e) '<unprintable message>')
  message <- cap_text(paste(message, collapse = '\n'))
  call <- condition_call(cond)
  head <- if (is.null(call)) paste0('Error: ', message) else paste0('Error in ', deparse_call(call), ' : ', message)
  frames <- if (is.null(calls)) list() else user_frames(calls)
  list(type = class(cond)[1L], message = message,
       traceback = paste(c(head, format_backtrace(frames)), collapse = '\n'))
}

# ------------------------------------------------------------------ warnings

LONGWARN <- 75L

warning_text <- function(w, extra) {
  msg <- w$message
  if (is.null(w$call)) return(msg)
  dcall <- deparse_call(w$call)
  line1 <- strsplit(msg, '\n', fixed = TRUE)[[1L]][1L]
  if (is.na(line1)) line1 <- ''
  sep <- if (extra + nchar(dcall) + nchar(line1) > LONGWARN) '\n  ' else ' '
  paste0('In ', dcall, ' :', sep, msg)
}

on_warning <- function(w) {
  level <- suppressWarnings(as.integer(getOption('warn', 0L)))
  if (is.na(level)) level <- 0L
  if (level < 0L) invokeRestart('muffleWarning')
  msg <- tryCatch(conditionMessage(w), error = function(e) '')
  call <- condition_call(w)
  if (level >= 2L) {
    # R turns warnings into errors in its default handler, which this
    # handler (muffling everything) keeps from running: do it here.
    state$error_calls <- sys.calls()
    stop(simpleError(paste0('(converted from warning) ', msg), call))
  }
  if (level == 1L) {
    head <- if (is.null(call)) 'Warning: ' else paste0('Warning in ', deparse_call(call), ' : ')
    cat(head, msg, '\n', sep = '', file = stderr())
  } else {
    state$n_warnings <- state$n_warnings + 1L
    if (state$n_warnings <= 50L) state$warnings[[state$n_warnings]] <- list(call = call, message = msg)
  }
  invokeRestart('muffleWarning')
}

# Prints the cell's warnings the way R's console does after a top-level call.
print_warnings <- function() {
  n <- state$n_warnings
  if (!n) return(invisible())
  ws <- state$warnings
  last <- structure(lapply(ws, function(w) w$call), names = vapply(ws, function(w) w$message, ''))
  tryCatch({
    unlockBinding('last.warning', baseenv())
    assign('last.warning', last, envir = baseenv())
  }, error = function(e) NULL)
  text <- if (n == 1L) {
    c('Warning message:', warning_text(ws[[1L]], 6L))
  } else if (n <= 10L) {
    c('Warning messages:', paste0(seq_len(n), ': ', vapply(ws, warning_text, '', extra = 10L)))
  } else if (n < 50L) {
    sprintf('There were %d warnings (use warnings() to see them)', n)
  } else {
    'There were 50 or more warnings (use warnings() to see the first 50)'
  }
  cat(text, sep = '\n', file = stderr())
}

# ------------------------------------------------------------------ cells

print_value <- function(x) if (isS4(x)) methods::show(x) else print(x)

# Evaluates the cell's expressions at top level, printing visible values.
run_exprs <- function(exprs) {
  state$base_n <- sys.nframe()
  for (ferrepl_expr in exprs) {
    vis <- withVisible(eval(ferrepl_expr, globalenv()))
    state$set_last_value(vis$value)
    if (vis$visible) print_value(vis$value)
  }
}

CLOSERS <- c(')', '}', ']', '"', "'", '`')

parse_status <- function(text) {
  r <- tryCatch({
    parse(text = text, keep.source = FALSE)
    'ok'
  }, error = function(e) conditionMessage(e))
  if (identical(r, 'ok')) 'ok'
  else if (grepl('unexpected end of input', r, fixed = TRUE)) 'incomplete'
  else if (grepl('INCOMPLETE_STRING', r, fixed = TRUE)) 'string'
  else 'error'
}

# What would complete the cell: closers tried one at a time (a newline first,
# so a trailing comment cannot swallow them).
incomplete_message <- function(code, status) {
  suffix <- character(0)
  text <- code
  for (step in 1:20) {
    candidates <- if (status == 'string') CLOSERS[4:6] else CLOSERS[1:3]
    found <- FALSE
    for (closer in candidates) {
      attempt <- paste0(text, if (status == 'string') '' else '\n', closer)
      st <- parse_status(attempt)
      if (st %in% c('ok', 'incomplete', 'string')) {
        suffix <- c(suffix, closer)
        text <- attempt
        status <- st
        found <- TRUE
        break
      }
    }
    if (!found) break
    if (status == 'ok') {
      quote <- suffix %in% CLOSERS[4:6]
      parts <- character(0)
      if (any(quote)) parts <- 'a closing quote'
      if (any(!quote)) parts <- c(parts, sprintf("'%s'", paste(suffix[!quote], collapse = '')))
      return(paste0('the cell is incomplete: missing ', paste(parts, collapse = ' and ')))
    }
  }
  'the cell is incomplete: it ends in the middle of an expression'
}

parse_cell <- function(code, name) {
  srcfile <- if (isTRUE(getOption('keep.source'))) srcfilecopy(name, code) else name
  tryCatch(parse(text = code, srcfile = srcfile), error = function(e) {
    msg <- conditionMessage(e)
    if (grepl('unexpected end of input', msg, fixed = TRUE) || grepl('INCOMPLETE_STRING', msg, fixed = TRUE)) {
      status <- if (grepl('INCOMPLETE_STRING', msg, fixed = TRUE)) 'string' else 'incomplete'
      m <- incomplete_message(code, status)
      structure(list(type = 'IncompleteInput', message = m, traceback = paste0('Error: ', m)), class = 'parse_failure')
    } else {
      structure(list(type = 'ParseError', message = msg, traceback = paste0('Error: ', msg)), class = 'parse_failure')
    }
  })
}

# Runs one cell: everything the user's code does happens inside
# allowInterrupts(), inside this tryCatch.
exec_cell <- function(exprs) {
  state$error_calls <- NULL
  tryCatch({
    withCallingHandlers(
      allowInterrupts(run_exprs(exprs)),
      warning = on_warning,
      error = function(e) if (is.null(state$error_calls)) state$error_calls <- sys.calls(),
      interrupt = function(c) state$error_calls <- sys.calls())
    list(status = 'ok', error = NULL)
  }, error = function(e) {
    list(status = 'error', error = error_info(e, state$error_calls))
  }, interrupt = function(c) {
    frames <- if (is.null(state$error_calls)) list() else user_frames(state$error_calls)
    list(status = 'interrupted',
         error = list(type = 'interrupt', message = 'interrupted',
                      traceback = paste(c('Interrupted', format_backtrace(frames)), collapse = '\n')))
  })
}

run_cell <- function(msg) {
  cell <- if (is.null(msg$cell)) 0 else msg$cell
  code <- if (is.null(msg$code)) '' else paste(msg$code, collapse = '\n')
  started <- unclass(Sys.time())
  state$cell <- cell
  state$stdin_lines <- character(0)
  state$warnings <- list()
  state$n_warnings <- 0L
  state$devices_before <- state$dev_list()
  result <- tryCatch({
    exprs <- parse_cell(code, sprintf('<cell %s>', json_number(cell)))
    if (inherits(exprs, 'parse_failure')) list(status = 'error', error = unclass(exprs))
    else exec_cell(exprs)
  }, error = function(e) list(status = 'error', error = error_info(e, NULL)),
     interrupt = function(c) list(status = 'interrupted', error = list(type = 'interrupt', message = 'interrupted', traceback = 'Interrupted')))
  finish_cell()
  send_fenced(list(ev = 'done', cell = cell, status = result$status, value = NULL, error = result$error,
                   elapsed_ms = (unclass(Sys.time()) - started) * 1000))
}

# After the user's code: undo sinks, report warnings, then plots.
finish_cell <- function() {
  try({
    while (sink.number() > 0L) sink()
    if (sink.number(type = 'message') != 2L) sink(type = 'message')
  }, silent = TRUE)
  try(print_warnings(), silent = TRUE)
  try(flush_plots(), silent = TRUE)
}

# ------------------------------------------------------------------ plots

# options(device): called by the first plot of a cell; one PNG per page, in a
# directory of the cell's own.
png_device <- function(width = 7, height = 5, ...) {
  dir <- state$plot_dir
  if (is.null(dir)) {
    dir <- tempfile('ferrepl-plots-')
    dir.create(dir, showWarnings = FALSE, recursive = TRUE)
    state$plot_dir <- dir
  }
  state$dev_seq <- state$dev_seq + 1L
  file <- file.path(dir, sprintf('plot-%04d-%%03d.png', state$dev_seq))
  if (!is.numeric(width) || length(width) != 1L || is.na(width)) width <- 7
  if (!is.numeric(height) || length(height) != 1L || is.na(height)) height <- 5
  if (state$cairo) grDevices::png(file, width = width, height = height, units = 'in', res = 100, type = 'cairo')
  else grDevices::png(file, width = width, height = height, units = 'in', res = 100)
}

png_size <- function(bytes) {
  if (length(bytes) < 24L) return(c(NA, NA))
  be <- function(b) sum(as.numeric(b) * 256^(3:0))
  c(be(bytes[17:20]), be(bytes[21:24]))
}

flush_plots <- function() {
  now <- state$dev_list()
  opened <- setdiff(now, state$devices_before)
  for (d in rev(opened)) try(grDevices::dev.off(d), silent = TRUE)
  dir <- state$plot_dir
  if (is.null(dir)) return(invisible())
  state$plot_dir <- NULL
  files <- sort(list.files(dir, pattern = '[.]png$', full.names = TRUE))
  for (f in files) {
    size <- file.size(f)
    if (is.na(size) || size == 0) next
    if (size > state$max_image_bytes) {
      cat(sprintf('ferrepl: a plot of %.0f bytes was not sent: the limit is %.0f bytes\n', size, state$max_image_bytes),
          file = stderr())
      next
    }
    bytes <- readBin(f, 'raw', size)
    wh <- png_size(bytes)
    send_fenced(list(ev = 'display', cell = state$cell, mime = 'image/png', data = base64(bytes),
                     bytes = size, width = wh[1L], height = wh[2L], sha = unname(tools::md5sum(f))))
  }
  unlink(dir, recursive = TRUE)
}

# ------------------------------------------------------------------ input

# Next line of input for the cell: lines of an earlier answer first, then a
# fenced input_request and a wait for the server's `input` request. NULL on
# end of input.
input_line <- function(prompt = '') {
  if (length(state$stdin_lines)) {
    line <- state$stdin_lines[1L]
    state$stdin_lines <- state$stdin_lines[-1L]
    return(line)
  }
  prompt <- paste(as.character(prompt), collapse = '')
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
    line <- buffered_line()
    if (is.null(line)) {
      if (length(state$rbuf)) {
        # The server is in the middle of writing a line into the chunk reader.
        line <- next_line()
      } else {
        line <- poll_line()
      }
    }
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

make_readLines <- function(orig) function(con = stdin(), n = -1L, ok = TRUE, warn = TRUE, encoding = 'unknown', skipNul = FALSE) {
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

count_items <- function(lines, sep) {
  if (!length(lines)) return(0L)
  text <- paste(lines, collapse = '\n')
  parts <- if (identical(sep, '') || is.null(sep)) strsplit(trimws(text), '[[:space:]]+')[[1L]]
           else strsplit(text, paste0('[', sep, '\n]'))[[1L]]
  sum(nzchar(parts))
}

make_scan <- function(orig) {
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
    mc$file <- ''
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
  stop("browser() needs an interactive R console, which ferrepl cannot serve; use print(), str() or traceback-style messages instead",
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

inspect <- function(msg) {
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
}

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
  comps <- head(u$.retrieveCompletions(), MAX_COMPLETIONS)
  items <- lapply(comps, function(t) list(text = t, kind = completion_kind(t)))
  list(ok = TRUE, engine = 'rcompgen', token = token, completions = I(items))
}

# ------------------------------------------------------------------ requests

handle_control <- function(msg) {
  op <- msg$op
  reply <- tryCatch(
    withCallingHandlers(
      if (identical(op, 'inspect')) inspect(msg)
      else if (identical(op, 'complete')) complete(msg)
      else list(ok = FALSE, message = 'unknown request'),
      warning = function(w) invokeRestart('muffleWarning')),
    error = function(e) list(ok = FALSE, message = sprintf('%s failed: %s', op, conditionMessage(e))))
  send(c(list(ev = 'reply', id = msg$id), reply))
}

handle_line <- function(line) {
  msg <- parse_request(line)
  if (is.null(msg)) return(invisible())
  if (identical(msg$op, 'exec')) run_cell(msg)
  else if (!is.null(msg$id)) handle_control(msg)
  # An `input` with no pending request (its cell ended) is dropped.
}

drain_interrupt <- function() tryCatch(allowInterrupts(Sys.sleep(0)), interrupt = function(c) NULL)

main_loop <- function() {
  repeat {
    line <- next_line()
    drain_interrupt()
    tryCatch(
      withCallingHandlers(handle_line(line), warning = function(w) invokeRestart('muffleWarning')),
      error = function(e) NULL, interrupt = function(c) NULL)
  }
}

# ------------------------------------------------------------------ start

setup_session <- function() {
  # Non-ASCII text must reach the server as UTF-8 whatever locale we got.
  if (!isTRUE(l10n_info()[['UTF-8']])) suppressWarnings(Sys.setlocale('LC_CTYPE', 'C.UTF-8'))
  nonce <- Sys.getenv('FERREPL_NONCE', '')
  if (!nzchar(nonce)) nonce <- strrep('0', 32L)
  Sys.unsetenv('FERREPL_NONCE')
  state$marker_prefix <- c(as.raw(0L), charToRaw('FERREPL:'), charToRaw(nonce), charToRaw(':'))
  num_env <- function(name, default) {
    v <- suppressWarnings(as.numeric(Sys.getenv(name, '')))
    Sys.unsetenv(name)
    if (is.na(v) || v <= 0) default else v
  }
  state$max_image_bytes <- num_env('FERREPL_MAX_IMAGE_BYTES', 4194304)
  state$max_value_chars <- num_env('FERREPL_MAX_VALUE_CHARS', 200000)
  state$ppid <- parent_pid()
  state$cairo <- isTRUE(capabilities('cairo'))
  state$dev_list <- grDevices::dev.list

  # .Last.value as the console keeps it.
  tryCatch(unlockBinding('.Last.value', baseenv()), error = function(e) NULL)
  state$set_last_value <- function(v) tryCatch(assign('.Last.value', v, envir = baseenv()), error = function(e) NULL)

  options(device = png_device, help_type = 'text', pager = pager, browser = no_browser,
          keep.source = TRUE, menu.graphics = FALSE)
  tryCatch(tools::Rd2txt_options(underline_titles = FALSE), error = function(e) NULL)

  rebind('readline', make_readline())
  rebind('readLines', make_readLines(base::readLines))
  rebind('scan', make_scan(base::scan))
  rebind('browser', make_browser())
  rebind('closeAllConnections', make_close_all())
  rebind('menu', make_menu(), 'utils')
}

ferrepl_main <- function(requests) {
  suspendInterrupts({
    # Our own binary reader: chunked reads instead of one byte per call.
    state$req_bin <- fifo('/dev/fd/3', open = 'rb', blocking = TRUE)
    try(close(requests), silent = TRUE)
    state$ev_con <- open_out(4L)
    state$out_con <- open_out(1L)
    state$err_con <- open_out(2L)
    setup_session()
    send(list(ev = 'ready', pid = Sys.getpid(),
              version = paste(R.version$major, R.version$minor, sep = '.'),
              executable = file.path(R.home('bin'), 'R')))
    main_loop()
  })
}
