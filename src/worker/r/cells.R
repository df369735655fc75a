# The R driver, part 2 of 5 (after channel.R): running a cell, its errors,
# warnings and plots.

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
  identical(call, DRIVER_EVAL) || identical(call, DRIVER_WITHVISIBLE) || identical(call, DRIVER_PRINT) || identical(call, DRIVER_PRINTER)
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
  # A tool call's own frames end at the call the user made.
  at <- match(TRUE, vapply(calls[first:last], call_head, '') %in% TOOL_FRAMES)
  if (!is.na(at)) last <- first + at - 1L
  calls[first:last]
}

TOOL_FRAMES <- c('ferrepl_call', 'ferrepl_tools', 'ferrepl_servers')

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

# Warnings go through R's own default handler, which collects them (warn=0),
# prints them at once (warn=1), turns them into errors (warn>=2) or drops
# them (warn<0), exactly as the console does. This calling handler only
# counts them and drops the driver's eval() as a warning's call.
on_warning <- function(w) {
  state$n_warnings <- state$n_warnings + 1L
  call <- tryCatch(conditionCall(w), error = function(e) NULL)
  if (is.call(call) && is_driver_call(call)) {
    .Internal(.dfltWarn(conditionMessage(w), NULL))
    invokeRestart('muffleWarning')
  }
}

# Prints the warnings R collected during the cell (and sets last.warning for
# warnings()), without the "In addition: " R puts before them.
print_warnings <- function() {
  if (!state$n_warnings) return(invisible())
  con <- textConnection(NULL, 'w', local = TRUE)
  sink(con, type = 'message')
  tryCatch(.Internal(printDeferredWarnings()), finally = sink(type = 'message'))
  text <- textConnectionValue(con)
  close(con)
  if (length(text)) {
    text[1L] <- sub('^In addition: ', '', text[1L])
    # After the output on stdout, whichever pipe the server reads first.
    suspendInterrupts(fence(SYNC_FENCE))
    cat(text, sep = '\n', file = stderr())
  }
}

# ------------------------------------------------------------------ cells

# Printed from an environment whose top level is the global env, so S3
# methods defined in cells are found (dispatch from the driver's environment
# would stop at baseenv).
PRINT_X <- quote(print(x))
SHOW_X <- quote(methods::show(x))
print_value <- function(x) {
  env <- new.env(parent = globalenv())
  env$x <- x
  printer <- if (isS4(x)) SHOW_X else PRINT_X
  eval(printer, env)
}

# A visible value as the console prints it, without the blank lines some
# print methods start with (summary.lm's "\nCall:"): they cost the agent
# and say nothing. Large values print as they come.
print_top <- function(x) {
  if (utils::object.size(x) > 65536) return(invisible(print_value(x)))
  out <- utils::capture.output(print_value(x))
  first <- match(TRUE, nzchar(out))
  if (!is.na(first)) cat(paste0(out[first:length(out)], '\n'), sep = '')
  invisible(x)
}

# Evaluates the cell's expressions at top level, printing visible values.
run_exprs <- function(exprs) {
  state$base_n <- sys.nframe()
  for (expr in exprs) {
    # The expression runs in an inner eval() called from the global env, so
    # that parent.frame() at top level is the global env, as in the console.
    ferrepl_top <- as.call(list(.Internal, as.call(list(EVAL_SYM, as.call(list(quote, expr)), globalenv(), baseenv()))))
    vis <- withVisible(eval(ferrepl_top, globalenv()))
    state$set_last_value(vis$value)
    if (vis$visible) print_top(vis$value)
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
    in_string <- status == 'string'
    candidates <- if (in_string) CLOSERS[4:6] else CLOSERS[1:3]
    attempts <- paste0(text, if (in_string) '' else '\n', candidates)
    results <- vapply(attempts, parse_status, '', USE.NAMES = FALSE)
    # Prefer a closer that completes the cell; inside a string only the
    # matching quote counts (another one leaves the string open).
    pick <- match('ok', results)
    if (is.na(pick)) pick <- match('incomplete', results)
    if (is.na(pick)) break
    suffix <- c(suffix, candidates[pick])
    text <- attempts[pick]
    status <- results[pick]
    if (status == 'ok') {
      is_quote <- suffix %in% CLOSERS[4:6]
      parts <- character(0)
      if (any(is_quote)) parts <- 'a closing quote'
      if (any(!is_quote)) parts <- c(parts, sprintf("'%s'", paste(suffix[!is_quote], collapse = '')))
      return(paste0('the cell is incomplete: missing ', paste(parts, collapse = ' and ')))
    }
  }
  'the cell is incomplete: it ends in the middle of an expression'
}

# srcfilecopy() without its argument checks, which cost more than parsing a
# small cell.
cell_srcfile <- function(name, code) {
  e <- new.env(hash = FALSE, parent = emptyenv())
  e$filename <- name
  e$wd <- getwd()
  e$isFile <- FALSE
  e$lines <- if (grepl('\n', code, fixed = TRUE)) strsplit(paste0(code, '\n'), '\n', fixed = TRUE)[[1L]] else code
  e$fixedNewlines <- TRUE
  e$timestamp <- Sys.time()
  e$Enc <- 'unknown'
  class(e) <- c('srcfilecopy', 'srcfile')
  e
}

# A parse error as the cell's error (the incomplete-input message says what
# is missing).
parse_failure <- function(e, code) {
  msg <- conditionMessage(e)
  if (grepl('unexpected end of input', msg, fixed = TRUE) || grepl('INCOMPLETE_STRING', msg, fixed = TRUE)) {
    status <- if (grepl('INCOMPLETE_STRING', msg, fixed = TRUE)) 'string' else 'incomplete'
    m <- incomplete_message(code, status)
    list(type = 'IncompleteInput', message = m, traceback = paste0('Error: ', m))
  } else {
    list(type = 'ParseError', message = msg, traceback = paste0('Error: ', msg))
  }
}

# message() writes to stderr while cat() and print() write to stdout: sync
# fences around each message keep the two pipes in the order of the writes.
on_message <- function(m) {
  suspendInterrupts(fence(SYNC_FENCE))
  cat(conditionMessage(m), file = stderr(), sep = '')
  suspendInterrupts(fence(SYNC_FENCE))
  invokeRestart('muffleMessage')
}

# Parses and runs one cell: everything the user's code does happens inside
# allowInterrupts(), inside this tryCatch (which also catches a parse error:
# one tryCatch less per cell).
exec_cell <- function(code, name) {
  state$error_calls <- NULL
  parsed <- FALSE
  tryCatch({
    srcfile <- if (isTRUE(getOption('keep.source'))) cell_srcfile(name, code) else name
    exprs <- parse(text = code, srcfile = srcfile)
    parsed <- TRUE
    withCallingHandlers(
      allowInterrupts(run_exprs(exprs)),
      warning = on_warning,
      message = on_message,
      error = function(e) if (is.null(state$error_calls)) state$error_calls <- sys.calls(),
      interrupt = function(c) state$error_calls <- sys.calls())
    list(status = 'ok', error = NULL)
  }, error = function(e) {
    list(status = 'error', error = if (parsed) error_info(e, state$error_calls) else parse_failure(e, code))
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
  state$n_warnings <- 0L
  state$devices_before <- device_names()
  # A failure of the driver itself is caught in main_loop(), which still
  # sends a done event for state$running.
  state$running <- cell
  result <- exec_cell(code, sprintf('<cell %s>', json_number(cell)))
  finish_cell()
  send_done(cell, result, (unclass(Sys.time()) - started) * 1000)
}

# The done event; the common case is formatted directly and written with
# its fence (it is sent after every cell, and to_json() costs more than the
# rest of a small cell).
send_done <- function(cell, result, elapsed) suspendInterrupts({
  state$running <- NULL
  if (!is.null(result$error)) {
    return(send_fenced(list(ev = 'done', cell = cell, status = result$status, value = NULL,
                            error = result$error, elapsed_ms = elapsed)))
  }
  head <- sprintf('{"ev":"done","cell":%s,"status":"%s","value":null,"error":null,"elapsed_ms":%.3f,"fence":',
                  json_number(cell), result$status, elapsed)
  f <- fence(event = paste0(gsub('%', '%%', head, fixed = TRUE), '%d,"fenced":["stdout","stderr"]}'))
  if (!f$sent) write_event(paste0(head, f$number, ',"fenced":', to_json(I(f$fenced)), '}'))
  invisible()
})

# After the user's code: undo sinks, report warnings, then plots.
finish_cell <- function() {
  # sink.number() through .Internal: its match.arg() costs more than a cell.
  if (.Internal(sink.number(TRUE)) > 0L || .Internal(sink.number(FALSE)) != 2L) {
    tryCatch({
      while (sink.number() > 0L) sink()
      if (sink.number(type = 'message') != 2L) sink(type = 'message')
    }, error = function(e) NULL)
  }
  if (state$n_warnings) tryCatch(print_warnings(), error = function(e) NULL)
  if (!is.null(state$plot_dir) || !identical(device_names(), state$devices_before))
    tryCatch(suppressWarnings(flush_plots()), error = function(e) NULL)
}

# The names of the device slots (.Devices): unchanged means no device was
# opened or closed, without the cost of dev.list().
device_names <- function() unlist(get0('.Devices', envir = baseenv(), inherits = FALSE))

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
  # Slots whose device is not the one that was there when the cell started.
  now <- device_names()
  before <- state$devices_before
  length(before) <- length(now)
  opened <- which(nzchar(now) & (is.na(before) | now != before))
  opened <- opened[opened > 1L]
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

