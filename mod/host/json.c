/*
 * json.c - the check that a module's record, which every later server
 * reads back, is a JSON object (RFC 8259, UTF-8). Rules: host.h.
 */
#include "host.h"

/* A JSON text (RFC 8259, UTF-8) whose top level is an object: the module's
 * record, which every later server reads back. Returns NULL, or what is
 * wrong with *at set to its offset. */
struct jp {
  const unsigned char *p;
  size_t n, i;
  int depth;
};

static void jws(struct jp *j) {
  while (j->i < j->n && (j->p[j->i] == ' ' || j->p[j->i] == '\t' ||
                         j->p[j->i] == '\n' || j->p[j->i] == '\r'))
    j->i++;
}

static int jdigits(struct jp *j) {
  size_t i0 = j->i;
  while (j->i < j->n && j->p[j->i] >= '0' && j->p[j->i] <= '9')
    j->i++;
  return j->i > i0 ? 0 : -1;
}

static int jstring(struct jp *j) {
  if (j->i >= j->n || j->p[j->i] != '"')
    return -1;
  j->i++;
  while (j->i < j->n) {
    unsigned char c = j->p[j->i];
    if (c == '"') {
      j->i++;
      return 0;
    }
    if (c < 0x20)
      return -1;
    if (c == '\\') {
      if (++j->i >= j->n)
        return -1;
      c = j->p[j->i++];
      if (c == 'u') {
        for (int k = 0; k < 4; k++, j->i++)
          if (j->i >= j->n || !strchr("0123456789abcdefABCDEF", j->p[j->i]) ||
              !j->p[j->i])
            return -1;
      } else if (!c || !strchr("\"\\/bfnrt", c)) {
        j->i--;
        return -1;
      }
      continue;
    }
    if (c < 0x80) {
      j->i++;
      continue;
    }
    /* UTF-8: a lead byte and its continuation bytes, shortest form */
    int more = c >= 0xf0 && c <= 0xf4 ? 3 : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : -1;
    if (more < 0 || c > 0xf4)
      return -1;
    if (j->i + (size_t)more >= j->n)
      return -1;
    unsigned char c1 = j->p[j->i + 1];
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) ||
        (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 > 0x8f))
      return -1;
    for (int k = 1; k <= more; k++)
      if ((j->p[j->i + (size_t)k] & 0xc0) != 0x80)
        return -1;
    j->i += (size_t)more + 1;
  }
  return -1;
}

static int jvalue(struct jp *j) {
  jws(j);
  if (j->i >= j->n)
    return -1;
  unsigned char c = j->p[j->i];
  if (c == '"')
    return jstring(j);
  if (c == '{' || c == '[') {
    if (++j->depth > 64)
      return -1;
    unsigned char close = c == '{' ? '}' : ']';
    j->i++;
    jws(j);
    if (j->i < j->n && j->p[j->i] == close) {
      j->i++;
      j->depth--;
      return 0;
    }
    for (;;) {
      if (c == '{') {
        jws(j);
        if (jstring(j))
          return -1;
        jws(j);
        if (j->i >= j->n || j->p[j->i] != ':')
          return -1;
        j->i++;
      }
      if (jvalue(j))
        return -1;
      jws(j);
      if (j->i >= j->n)
        return -1;
      if (j->p[j->i] == ',') {
        j->i++;
        continue;
      }
      if (j->p[j->i] != close)
        return -1;
      j->i++;
      j->depth--;
      return 0;
    }
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    if (c == '-')
      j->i++;
    if (j->i < j->n && j->p[j->i] == '0')
      j->i++;
    else if (jdigits(j))
      return -1;
    if (j->i < j->n && j->p[j->i] == '.') {
      j->i++;
      if (jdigits(j))
        return -1;
    }
    if (j->i < j->n && (j->p[j->i] == 'e' || j->p[j->i] == 'E')) {
      j->i++;
      if (j->i < j->n && (j->p[j->i] == '+' || j->p[j->i] == '-'))
        j->i++;
      if (jdigits(j))
        return -1;
    }
    return 0;
  }
  static const char *const lit[] = {"true", "false", "null"};
  for (int k = 0; k < 3; k++) {
    size_t l = strlen(lit[k]);
    if (j->n - j->i >= l && !memcmp(j->p + j->i, lit[k], l)) {
      j->i += l;
      return 0;
    }
  }
  return -1;
}

const char *json_object_error(const unsigned char *p, size_t n,
                              size_t *at) {
  struct jp j = {p, n, 0, 0};
  jws(&j);
  if (j.i >= n || p[j.i] != '{') {
    *at = j.i;
    return "is not a JSON object";
  }
  if (jvalue(&j)) {
    *at = j.i;
    return "is not valid JSON";
  }
  jws(&j);
  *at = j.i;
  return j.i == n ? NULL : "has bytes after its JSON object";
}
