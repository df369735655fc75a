# The R driver, part 4 of 5: code calls tools (issue 33). ferrepl_servers(),
# ferrepl_tools(server) and ferrepl_call(server, tool, ...) in an
# environment attached as "ferrepl" (the global environment stays the
# session's). Replies come on fd 3 as JSON lines, which this file decodes
# with a parser of its own: third-party data, never evaluated as R (every
# other request is an R expression written by the server).

state$upstream_id <- 0

# ------------------------------------------------------------------ JSON in

JSON_TOKEN <- paste0(
  '"[^"\\\\]*(?:\\\\.[^"\\\\]*)*"',              # a string (escapes unrolled)
  '|-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?',
  '|true|false|null|[][{}:,]|[ \t\r\n]+|.')
JSON_MAX_DEPTH <- 200L

json_unescape <- function(s) {
  if (!grepl('\\', s, fixed = TRUE)) return(s)
  parts <- regmatches(s, gregexpr('\\\\u[0-9a-fA-F]{4}|\\\\.|[^\\\\]+', s, perl = TRUE))[[1L]]
  units <- integer(0)
  out <- character(length(parts))
  flush_units <- function() {
    # UTF-16 code units to text; a lone surrogate becomes U+FFFD.
    if (!length(units)) return('')
    cps <- integer(0)
    i <- 1L
    while (i <= length(units)) {
      u <- units[i]
      if (u >= 0xD800L && u <= 0xDBFFL && i < length(units) &&
          units[i + 1L] >= 0xDC00L && units[i + 1L] <= 0xDFFFL) {
        cps <- c(cps, 0x10000L + (u - 0xD800L) * 1024L + (units[i + 1L] - 0xDC00L))
        i <- i + 2L
      } else {
        cps <- c(cps, if ((u >= 0xD800L && u <= 0xDFFFL) || u == 0L) 0xFFFDL else u)
        i <- i + 1L
      }
    }
    units <<- integer(0)
    intToUtf8(cps)
  }
  for (k in seq_along(parts)) {
    p <- parts[k]
    if (startsWith(p, '\\u')) {
      units <- c(units, strtoi(substr(p, 3L, 6L), 16L))
      next
    }
    pending <- flush_units()
    out[k] <- paste0(pending, if (startsWith(p, '\\')) switch(substr(p, 2L, 2L),
      '"' = '"', '\\' = '\\', '/' = '/', b = '\b', f = '\f', n = '\n', r = '\r', t = '\t',
      stop('invalid escape in JSON text')) else p)
  }
  out[length(out)] <- paste0(out[length(out)], flush_units())
  paste(out, collapse = '')
}

# The value of JSON `text`: objects as named lists, arrays as lists (an
# array of scalars of one type as a vector), null as NULL. Errors on
# anything that is not JSON.
json_parse <- function(text) {
  Encoding(text) <- 'UTF-8'
  tokens <- regmatches(text, gregexpr(JSON_TOKEN, text, perl = TRUE))[[1L]]
  tokens <- tokens[!grepl('^[ \t\r\n]', tokens)]
  pos <- 1L
  n <- length(tokens)
  peek <- function() if (pos <= n) tokens[pos] else ''
  take <- function() {
    if (pos > n) stop('JSON text ends too early')
    t <- tokens[pos]
    pos <<- pos + 1L
    t
  }
  expect <- function(t) if (!identical(take(), t)) stop('JSON text: expected ', t)
  value <- function(depth) {
    if (depth > JSON_MAX_DEPTH) stop('JSON text nested too deeply')
    t <- take()
    first <- substr(t, 1L, 1L)
    if (t == '{') {
      out <- list()
      keys <- character(0)
      if (peek() == '}') { take(); return(structure(list(), names = character(0))) }
      repeat {
        k <- take()
        if (substr(k, 1L, 1L) != '"') stop('JSON text: an object key must be a string')
        expect(':')
        out[length(out) + 1L] <- list(value(depth + 1L))
        keys <- c(keys, json_unescape(substr(k, 2L, nchar(k) - 1L)))
        sep <- take()
        if (sep == '}') break
        if (sep != ',') stop('JSON text: expected , or }')
      }
      names(out) <- keys
      return(out)
    }
    if (t == '[') {
      out <- list()
      if (peek() == ']') { take(); return(list()) }
      repeat {
        out[length(out) + 1L] <- list(value(depth + 1L))
        sep <- take()
        if (sep == ']') break
        if (sep != ',') stop('JSON text: expected , or ]')
      }
      return(simplify_array(out))
    }
    if (first == '"') return(json_unescape(substr(t, 2L, nchar(t) - 1L)))
    if (t == 'true') return(TRUE)
    if (t == 'false') return(FALSE)
    if (t == 'null') return(NULL)
    if (grepl('^-?[0-9]', t)) return(as.numeric(t))
    stop('JSON text: unexpected ', substr(t, 1L, 20L))
  }
  v <- value(1L)
  if (pos <= n) stop('JSON text: more after the value')
  v
}

simplify_array <- function(items) {
  if (!length(items)) return(items)
  scalar <- vapply(items, function(x) is.atomic(x) && length(x) == 1L && is.null(names(x)), TRUE)
  if (!all(scalar)) return(items)
  types <- unique(vapply(items, typeof, ''))
  if (length(types) != 1L) return(items)
  unlist(items, use.names = FALSE)
}

B64_VALUES <- local({
  v <- rep(NA_integer_, 256L)
  v[as.integer(B64_ALPHABET) + 1L] <- 0:63
  v
})

base64_decode <- function(text) {
  bytes <- charToRaw(gsub('[^A-Za-z0-9+/]', '', text))
  vals <- B64_VALUES[as.integer(bytes) + 1L]
  n <- length(vals) - length(vals) %% 4L
  tail_n <- length(vals) %% 4L
  out <- raw(0)
  if (n) {
    m <- matrix(vals[seq_len(n)], nrow = 4L)
    b <- rbind(m[1L, ] * 4L + m[2L, ] %/% 16L, (m[2L, ] %% 16L) * 16L + m[3L, ] %/% 4L,
               (m[3L, ] %% 4L) * 64L + m[4L, ])
    out <- as.raw(as.vector(b))
  }
  if (tail_n >= 2L) {
    t <- vals[(n + 1L):length(vals)]
    out <- c(out, as.raw(t[1L] * 4L + t[2L] %/% 16L))
    if (tail_n == 3L) out <- c(out, as.raw((t[2L] %% 16L) * 16L + t[3L] %/% 4L))
  }
  out
}

# ------------------------------------------------------------------ calls

# Sends an upstream request and waits for its reply (interruptible; an
# interrupt cancels it upstream). Other requests that come meanwhile are
# served or queued as while waiting for input.
upstream_request <- function(msg) {
  state$upstream_id <- state$upstream_id + 1
  id <- state$upstream_id
  send(c(list(ev = 'upstream', id = id), msg))
  answered <- FALSE
  on.exit(if (!answered) send(list(ev = 'upstream', id = id, op = 'cancel')))
  repeat {
    line <- poll_line()
    if (startsWith(line, '{')) {
      reply <- tryCatch(json_parse(line), error = function(e) e)
      if (inherits(reply, 'error')) {
        # The server writes these lines: one that does not decode is ours.
        answered <- TRUE
        stop(structure(class = c('ferrepl_upstream_error', 'ferrepl_error', 'error', 'condition'),
                       list(message = paste('the tool result could not be decoded:', conditionMessage(reply)),
                            call = sys.call(-1L))))
      }
      if (is.list(reply) && identical(reply$op, 'upstream_reply') &&
          isTRUE(as.numeric(reply$id) == id)) break
      next  # a late reply to an earlier, cancelled call
    }
    req <- parse_request(line)
    if (is.null(req)) next
    if (identical(req$op, 'exec')) {
      state$queue[[length(state$queue) + 1L]] <- line
    } else if (!is.null(req$id)) {
      suspendInterrupts(handle_control(req))
    }
  }
  answered <- TRUE
  if (!isTRUE(reply$ok)) {
    kind <- if (is.character(reply$kind)) reply$kind else 'failed'
    class <- switch(kind, tool_error = 'ferrepl_tool_error', refused = 'ferrepl_refused', 'ferrepl_upstream_error')
    message <- if (is.character(reply$error)) reply$error else 'the call failed'
    stop(structure(class = c(class, 'ferrepl_error', 'error', 'condition'),
                   list(message = message, call = sys.call(-1L))))
  }
  reply$result
}

# A tool's result as R sees it: the structured content (a list) when the
# tool gives one; else its text when it is only text; else a list of its
# blocks: text as strings, images as list(type = 'image', mime_type, data
# = raw bytes), others as they came.
tool_result <- function(r) {
  if (!is.null(r$structured)) return(r$structured)
  blocks <- r$content
  if (!length(blocks)) return('')
  types <- vapply(blocks, function(b) if (is.character(b$type)) b$type else '', '')
  if (all(types == 'text')) return(paste(vapply(blocks, function(b) b$text, ''), collapse = '\n'))
  lapply(blocks, function(b) {
    if (identical(b$type, 'text')) b$text
    else if (identical(b$type, 'image')) list(type = 'image', mime_type = b$mime, data = base64_decode(b$data))
    else b$value
  })
}

make_tool_functions <- function() {
  env <- new.env(parent = baseenv())
  env$ferrepl_servers <- function() {
    s <- upstream_request(list(op = 'servers'))
    if (length(s)) as.character(unlist(s)) else character(0)
  }
  env$ferrepl_tools <- function(server) {
    upstream_request(list(op = 'tools', server = as.character(server)[1L]))
  }
  env$ferrepl_call <- function(server, tool, ...) {
    args <- list(...)
    if (length(args) && (is.null(names(args)) || any(!nzchar(names(args)))))
      stop("name every argument of the tool, e.g. ferrepl_call('server', 'tool', query = 'x')", call. = FALSE)
    if (!length(args)) args <- structure(list(), names = character(0))
    r <- upstream_request(list(op = 'call', server = as.character(server)[1L],
                               tool = as.character(tool)[1L], arguments = args))
    tool_result(r)
  }
  env
}

attach_tool_functions <- function() {
  env <- make_tool_functions()
  attach_ <- get('attach', baseenv())
  suppressMessages(attach_(env, name = 'ferrepl', warn.conflicts = FALSE))
}
