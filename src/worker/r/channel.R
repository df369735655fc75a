# ferrepl's R driver, part 1 of 5 (channel.R, cells.R, console.R, tools.R, main.R,
# sent as one text in that order). boot.R evaluates it in a private environment
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
DRIVER_EVAL <- quote(eval(ferrepl_top, globalenv()))
DRIVER_WITHVISIBLE <- quote(withVisible(eval(ferrepl_top, globalenv())))
DRIVER_PRINT <- quote(print_value(vis$value))
EVAL_SYM <- as.name('eval')
DRIVER_PRINTER <- quote(eval(printer, env))

# ------------------------------------------------------------------ JSON

JSON_CONTROLS <- setdiff(1:31, c(9L, 10L, 13L))

json_string <- function(x) {
  if (!is.character(x)) x <- as.character(x)
  # Fast path: one string of printable ASCII without quotes or backslashes.
  if (length(x) == 1L && !is.na(x)) {
    u <- utf8ToInt(x)
    if (!anyNA(u) && all(u >= 32L & u <= 126L & u != 34L & u != 92L)) return(paste0('"', x, '"'))
  }
  x <- enc2utf8(x)
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
  if (length(x) == 1L && is.finite(x) && x == trunc(x) && abs(x) < 1e15) return(sprintf('%.0f', x))
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
# Append mode: opening a regular file (a test's redirect) must not truncate it.
open_out <- function(fd) file(sprintf('/dev/fd/%d', fd), open = 'ab', raw = TRUE)

OUTPUTS <- list(ev_con = 4L, out_con = 1L, err_con = 2L)

driver_connections <- function() {
  cons <- list(state$ev_con, state$out_con, state$err_con, state$req_bin, state$req_nb)
  nums <- vapply(cons, function(con) if (is.null(con)) NA_integer_ else as.integer(con), 0L)
  nums[!is.na(nums)]
}

# Whether a connection handle still names the connection it was made for:
# user code may close ours, and a number may then be reused for another.
con_ok <- function(con) {
  if (is.null(con)) return(FALSE)
  n <- as.integer(con)
  n %in% getAllConnections() && identical(attr(getConnection(n), 'conn_id'), attr(con, 'conn_id'))
}

# Reopens output connections that user code closed. Checked in full only
# when the set of open connections changed since the last check (cheap).
check_outputs <- function() {
  open_now <- getAllConnections()
  if (identical(open_now, state$connections_seen)) return(invisible())
  for (key in names(OUTPUTS)) {
    if (!con_ok(state[[key]])) {
      state[[key]] <- tryCatch(open_out(OUTPUTS[[key]]), error = function(e) NULL)
    }
  }
  state$connections_seen <- getAllConnections()
}

write_out <- function(key, bytes) {
  tryCatch({
    writeBin(bytes, state[[key]])
    flush(state[[key]])
    TRUE
  }, error = function(e) FALSE)
}

write_event <- function(txt) {
  check_outputs()
  bytes <- c(charToRaw(txt), as.raw(10L))
  if (!write_out('ev_con', bytes)) {
    # A connection closed under us that the cheap check missed: reopen once.
    state$ev_con <- tryCatch(open_out(4L), error = function(e) NULL)
    write_out('ev_con', bytes)
  }
}

send <- function(ev) suspendInterrupts({
  txt <- to_json(ev)
  if (nchar(txt, type = 'bytes') > MAX_EVENT_BYTES) txt <- to_json(shrink_event(ev))
  write_event(txt)
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

BOTH_STREAMS <- c('stdout', 'stderr')

# Writes fence marker n on both output pipes (after R's own buffers);
# returns the number and the streams that got it. `kind` 0 closes the output
# an event owns; 1 (a sync fence) only orders the two pipes: the server puts
# everything written before it, on either pipe, before everything after.
SYNC_FENCE <- 1L
fence <- function(kind = 0L, event = NULL) {
  check_outputs()
  n <- state$fence + 1L
  state$fence <- n
  marker <- c(state$marker_prefix, charToRaw(sprintf('%016x', n)), as.raw(kind))
  # One tryCatch for the whole fast path (each costs more than the writes):
  # `stage` says how far it got when something failed.
  stage <- 0L
  tryCatch({
    flush(stdout())
    flush(stderr())
    stage <- 1L
    writeBin(marker, state$out_con)
    flush(state$out_con)
    stage <- 2L
    writeBin(marker, state$err_con)
    flush(state$err_con)
    stage <- 3L
    if (!is.null(event)) {
      # `event` is formatted for both streams fenced.
      writeBin(c(charToRaw(sprintf(event, n)), as.raw(10L)), state$ev_con)
      flush(state$ev_con)
    }
    stage <- 4L
  }, error = function(e) NULL)
  if (stage == 4L) return(list(number = n, fenced = BOTH_STREAMS, sent = TRUE))
  # Slow path: a failed flush of R's own buffers is ignored; what failed
  # after it is reopened and written once, never writing a marker twice.
  out_done <- stage >= 2L
  err_done <- stage >= 3L
  for (key in c(if (!out_done) 'out_con', if (!err_done) 'err_con')) {
    state[[key]] <- tryCatch(open_out(OUTPUTS[[key]]), error = function(e) NULL)
    done <- write_out(key, marker)
    if (key == 'out_con') out_done <- done else err_done <- done
  }
  list(number = n, fenced = BOTH_STREAMS[c(out_done, err_done)], sent = FALSE)
}

send_fenced <- function(ev) suspendInterrupts({
  f <- fence()
  ev$fence <- f$number
  ev$fenced <- I(f$fenced)
  send(ev)
})

quit_now <- function() quit(save = 'no', status = 0, runLast = FALSE)

# Requests arrive on fd 3 through two connections that share one buffer
# (state$rbuf), both reading in chunks (readLines on a fifo makes one system
# call per byte): a blocking one while idle, and a non-blocking one while a
# cell waits for input, polled between Sys.sleep() calls so that an interrupt
# can end the wait (a blocking read cannot be interrupted, see above).

# The next request line while idle.
next_line <- function() {
  if (length(state$queue)) {
    line <- state$queue[[1L]]
    state$queue <- state$queue[-1L]
    return(line)
  }
  failures <- 0L
  repeat {
    line <- buffered_line()
    if (!is.null(line)) return(line)
    chunk <- tryCatch({
      # User code may have closed the connection; fd 3 itself stays open.
      if (!con_ok(state$req_bin)) state$req_bin <- fifo('/dev/fd/3', open = 'rb', blocking = TRUE)
      readBin(state$req_bin, 'raw', 65536L)
    }, error = function(e) NULL)
    if (is.null(chunk)) {
      # A control channel that cannot be read means the server is gone.
      failures <- failures + 1L
      if (failures > 3L) quit_now()
      state$req_bin <- NULL
      next
    }
    if (!length(chunk)) quit_now()
    state$rbuf <- c(state$rbuf, chunk)
  }
}

# The next request line while user code waits: interruptible.
poll_line <- function() {
  delay <- 0.0005
  repeat {
    line <- buffered_line()
    if (!is.null(line)) return(line)
    # A non-blocking read errs when there is no data and gives raw(0) at end
    # of file. The read and the append happen with interrupts held off, so
    # an interrupt cannot lose bytes.
    got <- suspendInterrupts({
      chunk <- tryCatch({
        if (!con_ok(state$req_nb)) state$req_nb <- fifo('/dev/fd/3', open = 'rb', blocking = FALSE)
        readBin(state$req_nb, 'raw', 65536L)
      }, error = function(e) NULL)
      if (!is.null(chunk) && !length(chunk)) quit_now()
      state$rbuf <- c(state$rbuf, chunk)
      !is.null(chunk)
    })
    if (got) {
      delay <- 0.0005
    } else {
      Sys.sleep(delay)
      delay <- min(delay * 1.5, 0.05)
    }
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
  # JSON lines (tool call replies, tools.R) are data: never evaluated.
  if (startsWith(line, '{')) return(NULL)
  msg <- tryCatch(eval(str2lang(line), baseenv()), error = function(e) NULL)
  if (is.list(msg)) msg else NULL
}

