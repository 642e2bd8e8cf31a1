-- bunkai: broad SQLite shell exercise for scatter tests.
--
-- Run as:   sqlite3 :memory: < full.sql      (no -bail, no .bail on)
--
-- The shell exits with status 1 because of those errors; compare stdout
-- and stderr, not the exit status alone.
--
-- Output is deterministic: every multi-row query has an ORDER BY, data is
-- generated with recursive CTEs from integer arithmetic (no random(), no
-- 'now').  Several statements fail ON PURPOSE (marked "EXPECTED ERROR");
-- the shell prints their messages on stderr and carries on.
-- Needs FTS5, R*Tree, math functions and JSON (built in since 3.38).

.headers on
.mode list
.nullvalue NULL
PRAGMA foreign_keys = ON;

SELECT '== 1. schema ==' AS section;

CREATE TABLE departments (
    dept_id   INTEGER PRIMARY KEY,
    name      TEXT NOT NULL UNIQUE,
    budget    REAL NOT NULL CHECK (budget >= 0),
    region    TEXT NOT NULL DEFAULT 'north' CHECK (region IN ('north','south','east','west'))
);

CREATE TABLE employees (
    emp_id    INTEGER PRIMARY KEY,
    dept_id   INTEGER NOT NULL REFERENCES departments(dept_id) ON DELETE CASCADE,
    manager_id INTEGER REFERENCES employees(emp_id),
    first     TEXT NOT NULL,
    last      TEXT NOT NULL,
    email     TEXT NOT NULL UNIQUE,
    salary    INTEGER NOT NULL CHECK (salary > 0),
    hired     TEXT NOT NULL,              -- ISO date
    level     INTEGER NOT NULL DEFAULT 1 CHECK (level BETWEEN 1 AND 5)
);

CREATE TABLE projects (
    proj_id   INTEGER PRIMARY KEY,
    dept_id   INTEGER NOT NULL REFERENCES departments(dept_id),
    title     TEXT NOT NULL,
    started   TEXT NOT NULL,
    cost      REAL NOT NULL DEFAULT 0
);

CREATE TABLE assignments (
    emp_id    INTEGER NOT NULL REFERENCES employees(emp_id) ON DELETE CASCADE,
    proj_id   INTEGER NOT NULL REFERENCES projects(proj_id) ON DELETE CASCADE,
    hours     INTEGER NOT NULL CHECK (hours BETWEEN 0 AND 2000),
    PRIMARY KEY (emp_id, proj_id)
) WITHOUT ROWID;

CREATE TABLE audit_log (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    action    TEXT NOT NULL,
    tbl       TEXT NOT NULL,
    row_id    INTEGER,
    detail    TEXT
);

CREATE TABLE inventory (
    sku       TEXT PRIMARY KEY,
    qty       INTEGER NOT NULL DEFAULT 0,
    price     REAL NOT NULL,
    updates   INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE ledger (
    id        INTEGER PRIMARY KEY,
    account   TEXT NOT NULL,
    amount    INTEGER NOT NULL,
    note      TEXT
) STRICT;

SELECT type, name, tbl_name FROM sqlite_schema
 WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name;

SELECT '== 2. triggers ==' AS section;

CREATE TRIGGER trg_emp_insert AFTER INSERT ON employees
WHEN NEW.emp_id % 500 = 0
BEGIN
    INSERT INTO audit_log(action, tbl, row_id, detail)
    VALUES ('insert', 'employees', NEW.emp_id, NEW.first || ' ' || NEW.last);
END;

CREATE TRIGGER trg_emp_salary AFTER UPDATE OF salary ON employees
WHEN NEW.salary <> OLD.salary
BEGIN
    INSERT INTO audit_log(action, tbl, row_id, detail)
    VALUES ('raise', 'employees', NEW.emp_id,
            printf('%d -> %d (%+.1f%%)', OLD.salary, NEW.salary,
                   100.0 * (NEW.salary - OLD.salary) / OLD.salary));
END;

CREATE TRIGGER trg_emp_delete BEFORE DELETE ON employees
BEGIN
    INSERT INTO audit_log(action, tbl, row_id, detail)
    VALUES ('delete', 'employees', OLD.emp_id, OLD.email);
END;

CREATE TRIGGER trg_proj_cost AFTER INSERT ON assignments
BEGIN
    UPDATE projects SET cost = cost + NEW.hours * 1.5 WHERE proj_id = NEW.proj_id;
END;

CREATE TRIGGER trg_ledger_guard BEFORE INSERT ON ledger
WHEN NEW.amount = 0
BEGIN
    SELECT RAISE(ABORT, 'ledger: zero amounts are not allowed');
END;

SELECT '== 3. data generation ==' AS section;

INSERT INTO departments(dept_id, name, budget, region)
WITH RECURSIVE d(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM d WHERE n < 12)
SELECT n,
       'Dept-' || char(64 + n),
       100000.0 + (n * 7919 % 50) * 10000,
       CASE n % 4 WHEN 0 THEN 'north' WHEN 1 THEN 'south' WHEN 2 THEN 'east' ELSE 'west' END
FROM d;

-- 5000 employees; names, salaries and dates come from integer hashes
INSERT INTO employees(emp_id, dept_id, manager_id, first, last, email, salary, hired, level)
WITH RECURSIVE
  e(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM e WHERE n < 5000),
  fn(i, name) AS (VALUES (0,'Ada'),(1,'Brian'),(2,'Chen'),(3,'Dana'),(4,'Emil'),
                         (5,'Fatima'),(6,'Goran'),(7,'Hana'),(8,'Ivan'),(9,'Jun')),
  ln(i, name) AS (VALUES (0,'Smith'),(1,'Okafor'),(2,'Garcia'),(3,'Novak'),(4,'Ito'),
                         (5,'Muller'),(6,'Rossi'),(7,'Kowalski'),(8,'Silva'),(9,'Haddad'),
                         (10,'Larsen'),(11,'Nguyen'),(12,'Petrov'))
SELECT n,
       1 + (n * 31) % 12,
       CASE WHEN n <= 12 THEN NULL ELSE 1 + (n * 13) % 12 END,
       fn.name,
       ln.name,
       lower(fn.name) || '.' || lower(ln.name) || '.' || n || '@example.org',
       30000 + (n * 7919) % 90000,
       date('2010-01-01', '+' || ((n * 104729) % 4748) || ' days'),
       1 + (n * 17) % 5
FROM e
JOIN fn ON fn.i = (n * 7) % 10
JOIN ln ON ln.i = (n * 11) % 13;

INSERT INTO projects(proj_id, dept_id, title, started)
WITH RECURSIVE p(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM p WHERE n < 60)
SELECT n, 1 + (n * 5) % 12,
       printf('Project %s-%03d', substr('ABCDEFGHIJKL', 1 + n % 12, 1), n),
       date('2018-03-15', printf('%+d days', (n * 37) % 1500))
FROM p;

INSERT INTO assignments(emp_id, proj_id, hours)
WITH RECURSIVE a(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM a WHERE n < 8000)
SELECT 1 + (n * 7) % 5000, 1 + (n * 11) % 60, (n * 97) % 1900
FROM a WHERE true
ON CONFLICT (emp_id, proj_id) DO UPDATE SET hours = hours + excluded.hours % 100;

INSERT INTO inventory(sku, qty, price)
WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200)
SELECT printf('SKU-%04d', n), (n * 53) % 400, round(1.25 + (n * 389) % 10000 / 100.0, 2) FROM s;

SELECT (SELECT count(*) FROM departments) AS departments,
       (SELECT count(*) FROM employees)   AS employees,
       (SELECT count(*) FROM projects)    AS projects,
       (SELECT count(*) FROM assignments) AS assignments,
       (SELECT count(*) FROM inventory)   AS inventory,
       (SELECT count(*) FROM audit_log)   AS audit_rows;

SELECT '== 4. indexes ==' AS section;

CREATE INDEX idx_emp_dept   ON employees(dept_id, salary DESC);
CREATE INDEX idx_emp_hired  ON employees(hired);
CREATE INDEX idx_emp_name   ON employees(last COLLATE NOCASE, first);
CREATE INDEX idx_asg_proj   ON assignments(proj_id);
CREATE UNIQUE INDEX idx_proj_title ON projects(title);
CREATE INDEX idx_emp_high   ON employees(salary) WHERE salary > 100000;
CREATE INDEX idx_emp_year   ON employees(substr(hired, 1, 4));
ANALYZE;

SELECT name, tbl_name FROM sqlite_schema WHERE type = 'index' AND name LIKE 'idx_%' ORDER BY name;
SELECT tbl, idx, stat FROM sqlite_stat1 WHERE idx LIKE 'idx_%' ORDER BY tbl, idx;

SELECT '== 5. joins ==' AS section;

SELECT d.name, count(e.emp_id) AS staff, sum(e.salary) AS payroll
FROM departments d
JOIN employees e ON e.dept_id = d.dept_id
GROUP BY d.dept_id ORDER BY d.name;

-- departments with projects (left join keeps departments without any)
SELECT d.name, count(p.proj_id) AS nproj, coalesce(sum(p.cost), 0) AS total_cost
FROM departments d
LEFT JOIN projects p ON p.dept_id = d.dept_id
GROUP BY d.dept_id ORDER BY nproj DESC, d.name;

-- three-way join
SELECT e.emp_id, e.first || ' ' || e.last AS name, p.title, a.hours
FROM assignments a
JOIN employees e ON e.emp_id = a.emp_id
JOIN projects p  ON p.proj_id = a.proj_id
WHERE a.hours > 1850
ORDER BY a.hours DESC, e.emp_id, p.proj_id
LIMIT 15;

-- self join: employee and manager
SELECT e.emp_id, e.first, m.emp_id AS mgr, m.first AS mgr_first
FROM employees e LEFT JOIN employees m ON m.emp_id = e.manager_id
WHERE e.emp_id IN (1, 2, 12, 13, 14, 100, 4999)
ORDER BY e.emp_id;

-- employees with no assignment (anti-join)
SELECT count(*) AS unassigned
FROM employees e LEFT JOIN assignments a ON a.emp_id = e.emp_id
WHERE a.emp_id IS NULL;

-- cross join, small
SELECT x.v AS x, y.v AS y, x.v * y.v AS product
FROM (SELECT 1 AS v UNION ALL SELECT 2 UNION ALL SELECT 3) AS x
     CROSS JOIN (SELECT 10 AS v UNION ALL SELECT 20) AS y
ORDER BY x, y;

SELECT '== 6. subqueries ==' AS section;

SELECT emp_id, first, last, salary FROM employees
WHERE salary > (SELECT avg(salary) * 1.59 FROM employees)
ORDER BY salary DESC, emp_id LIMIT 10;

SELECT d.name,
       (SELECT max(salary) FROM employees e WHERE e.dept_id = d.dept_id) AS top_salary,
       (SELECT count(*) FROM projects p WHERE p.dept_id = d.dept_id) AS projects
FROM departments d ORDER BY d.dept_id;

SELECT dept_id, emp_id, salary FROM employees e
WHERE salary = (SELECT max(salary) FROM employees e2 WHERE e2.dept_id = e.dept_id)
ORDER BY dept_id, emp_id;

SELECT title FROM projects p
WHERE NOT EXISTS (SELECT 1 FROM assignments a WHERE a.proj_id = p.proj_id AND a.hours > 1880)
ORDER BY title;

SELECT count(*) AS in_list FROM employees
WHERE dept_id IN (SELECT dept_id FROM departments WHERE region IN ('north', 'east'));

SELECT '== 7. views ==' AS section;

CREATE VIEW v_dept_stats AS
SELECT d.dept_id, d.name, d.region,
       count(e.emp_id) AS staff,
       round(avg(e.salary), 2) AS avg_salary,
       min(e.hired) AS first_hire,
       max(e.hired) AS last_hire
FROM departments d LEFT JOIN employees e ON e.dept_id = d.dept_id
GROUP BY d.dept_id;

CREATE VIEW v_proj_load AS
SELECT p.proj_id, p.title, count(a.emp_id) AS people, sum(a.hours) AS hours
FROM projects p LEFT JOIN assignments a ON a.proj_id = p.proj_id
GROUP BY p.proj_id;

SELECT * FROM v_dept_stats ORDER BY dept_id;
SELECT * FROM v_proj_load ORDER BY hours DESC, proj_id LIMIT 10;
SELECT region, sum(staff) AS staff, round(avg(avg_salary), 2) AS mean_avg
FROM v_dept_stats GROUP BY region ORDER BY region;

SELECT '== 8. aggregates ==' AS section;

SELECT level, count(*) AS n, sum(salary) AS total, round(avg(salary), 3) AS mean,
       min(salary) AS lo, max(salary) AS hi
FROM employees GROUP BY level ORDER BY level;

SELECT substr(hired, 1, 4) AS year, count(*) AS hires
FROM employees GROUP BY year HAVING count(*) >= 385 ORDER BY year;

SELECT dept_id, group_concat(first, ',') AS firsts
FROM (SELECT DISTINCT dept_id, first FROM employees ORDER BY dept_id, first)
GROUP BY dept_id ORDER BY dept_id;

SELECT last, count(DISTINCT first) AS distinct_firsts, total(salary) AS total
FROM employees GROUP BY last HAVING distinct_firsts >= 5 ORDER BY last;

SELECT count(*) FILTER (WHERE salary > 100000) AS rich,
       count(*) FILTER (WHERE salary < 40000) AS modest,
       sum(CASE WHEN level >= 4 THEN 1 ELSE 0 END) AS senior
FROM employees;

SELECT '== 9. window functions ==' AS section;

SELECT emp_id, dept_id, salary,
       row_number() OVER w AS rn,
       rank()       OVER w AS rnk,
       dense_rank() OVER w AS drnk
FROM employees
WHERE dept_id = 3 AND emp_id < 400
WINDOW w AS (PARTITION BY dept_id ORDER BY salary DESC)
ORDER BY rn;

SELECT emp_id, hired, salary,
       lag(salary)  OVER (ORDER BY hired, emp_id) AS prev_salary,
       lead(salary, 2, -1) OVER (ORDER BY hired, emp_id) AS next2_salary
FROM employees WHERE dept_id = 7 AND hired < '2010-06-01'
ORDER BY hired, emp_id;

SELECT dept_id, emp_id, salary,
       sum(salary) OVER (PARTITION BY dept_id) AS dept_total,
       sum(salary) OVER (PARTITION BY dept_id ORDER BY emp_id
                         ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running,
       ntile(4)    OVER (PARTITION BY dept_id ORDER BY salary, emp_id) AS quartile
FROM employees WHERE emp_id <= 48
ORDER BY dept_id, emp_id;

SELECT proj_id, hours,
       avg(hours) OVER (ORDER BY proj_id ROWS BETWEEN 2 PRECEDING AND 2 FOLLOWING) AS moving_avg,
       first_value(hours) OVER (ORDER BY proj_id) AS first_h,
       last_value(hours) OVER (ORDER BY proj_id ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS last_h,
       percent_rank() OVER (ORDER BY hours) AS pr,
       cume_dist() OVER (ORDER BY hours) AS cd
FROM v_proj_load WHERE proj_id <= 12 ORDER BY proj_id;

SELECT year, hires, sum(hires) OVER (ORDER BY year) AS cumulative
FROM (SELECT substr(hired, 1, 4) AS year, count(*) AS hires FROM employees GROUP BY 1)
ORDER BY year;

SELECT '== 10. JSON ==' AS section;

SELECT json_object('id', emp_id, 'name', first || ' ' || last,
                   'tags', json_array(level, dept_id), 'senior', json(CASE WHEN level > 3 THEN 'true' ELSE 'false' END)) AS doc
FROM employees WHERE emp_id BETWEEN 1 AND 5 ORDER BY emp_id;

CREATE TABLE docs (id INTEGER PRIMARY KEY, body TEXT CHECK (json_valid(body)));
INSERT INTO docs(id, body)
SELECT dept_id, json_object('dept', name, 'budget', budget,
                            'staff', (SELECT json_group_array(emp_id) FROM
                                       (SELECT emp_id FROM employees e WHERE e.dept_id = d.dept_id ORDER BY emp_id LIMIT 4)))
FROM departments d;

SELECT id, json_extract(body, '$.dept') AS dept, body ->> '$.budget' AS budget,
       json_array_length(body, '$.staff') AS n, body -> '$.staff[0]' AS first_staff
FROM docs ORDER BY id;

SELECT d.id, j.key, j.value, j.type
FROM docs d, json_each(d.body, '$.staff') j
WHERE d.id <= 3 ORDER BY d.id, j.key;

SELECT j.fullkey, j.type, j.atom
FROM json_tree('{"a":1,"b":[2,3.5,{"c":null}],"d":"x"}') j ORDER BY j.id;

SELECT json_set('{"a":1}', '$.b', 2, '$.a', 10) AS set1,
       json_remove('[0,1,2,3]', '$[1]') AS removed,
       json_patch('{"a":1,"b":2}', '{"b":null,"c":3}') AS patched,
       json_group_object(sku, qty) AS grouped
FROM (SELECT sku, qty FROM inventory ORDER BY sku LIMIT 3);

SELECT '== 11. full-text search (FTS5) ==' AS section;

CREATE VIRTUAL TABLE notes USING fts5(title, body, tokenize = 'porter unicode61');
INSERT INTO notes(rowid, title, body)
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300)
SELECT i,
       'note ' || i,
       'The ' || CASE i % 5 WHEN 0 THEN 'quick' WHEN 1 THEN 'lazy' WHEN 2 THEN 'sleepy'
                                WHEN 3 THEN 'clever' ELSE 'brown' END
       || ' ' || CASE i % 3 WHEN 0 THEN 'fox' WHEN 1 THEN 'dog' ELSE 'cat' END
       || ' ' || CASE i % 7 WHEN 0 THEN 'jumped over databases' WHEN 1 THEN 'runs quickly'
                            WHEN 2 THEN 'was indexing documents' WHEN 3 THEN 'reads SQL'
                            WHEN 4 THEN 'jumps' WHEN 5 THEN 'sleeps all day' ELSE 'queries tables' END
FROM n;

SELECT count(*) AS fox_hits FROM notes WHERE notes MATCH 'fox';
SELECT rowid, title, body FROM notes WHERE notes MATCH 'quick AND fox AND jump' ORDER BY rowid LIMIT 10;
SELECT rowid, highlight(notes, 1, '[', ']') AS hl FROM notes
 WHERE notes MATCH 'body:index*' ORDER BY rowid LIMIT 8;
SELECT rowid, snippet(notes, 1, '<', '>', '...', 3) AS snip FROM notes
 WHERE notes MATCH '"sleeps all"' ORDER BY rowid LIMIT 5;
SELECT rowid, round(bm25(notes), 6) AS score FROM notes
 WHERE notes MATCH 'clever NOT cat' ORDER BY score, rowid LIMIT 6;

SELECT '== 12. R*Tree ==' AS section;

CREATE VIRTUAL TABLE boxes USING rtree(id, minx, maxx, miny, maxy);
INSERT INTO boxes
WITH RECURSIVE b(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM b WHERE i < 1000)
SELECT i, (i * 37) % 1000, (i * 37) % 1000 + 5 + i % 20,
          (i * 91) % 1000, (i * 91) % 1000 + 5 + i % 15
FROM b;

SELECT id, minx, maxx, miny, maxy FROM boxes
WHERE minx >= 100 AND maxx <= 200 AND miny >= 300 AND maxy <= 500 ORDER BY id;
SELECT count(*) AS overlapping FROM boxes
WHERE maxx >= 400 AND minx <= 600 AND maxy >= 400 AND miny <= 600;
SELECT a.id, b.id FROM boxes a, boxes b
WHERE a.id < b.id AND a.id <= 40
  AND b.minx <= a.maxx AND b.maxx >= a.minx AND b.miny <= a.maxy AND b.maxy >= a.miny
ORDER BY a.id, b.id LIMIT 12;

SELECT '== 13. math ==' AS section;

SELECT abs(-7) AS abs_, round(2.5) AS r1, round(-2.5) AS r2, round(3.14159, 3) AS r3,
       ceil(4.1) AS ce, floor(-4.1) AS fl, trunc(-4.7) AS tr,
       sqrt(2) AS sq, pow(2, 10) AS pw, exp(1) AS e, ln(10) AS ln10,
       log10(1000) AS l10, log2(1024) AS l2, log(2, 8) AS lg,
       pi() AS pi, round(sin(pi() / 6), 12) AS s, round(cos(pi() / 3), 12) AS c,
       round(atan2(1, 1), 12) AS at, degrees(pi()) AS deg, radians(180) AS rad,
       mod(17, 5) AS m, 17 % 5 AS pct, 17 / 5 AS idiv, 17.0 / 5 AS fdiv,
       1 / 0 AS div0, sign(-3) AS sg, max(3, 9, 1) AS mx, min(3, 9, 1) AS mn;

SELECT level, round(stddev, 4) AS stddev FROM
 (SELECT level, sqrt(avg(salary * salary) - avg(salary) * avg(salary)) AS stddev
  FROM employees GROUP BY level) ORDER BY level;

SELECT 9223372036854775807 + 0 AS maxint, -9223372036854775808 AS minint,
       9223372036854775807 + 1 AS overflow_to_real, 0x7fffffff AS hex,
       cast('12abc' AS INTEGER) AS cast_int, cast(3.99 AS INTEGER) AS trunc_cast,
       typeof(1) AS t1, typeof(1.0) AS t2, typeof('1') AS t3, typeof(x'01') AS t4, typeof(NULL) AS t5;

SELECT '== 14. date and time ==' AS section;

SELECT date('2024-02-28', '+1 day') AS leap, date('2023-02-28', '+1 day') AS nonleap,
       datetime('2024-03-10 12:34:56', '+90 minutes') AS plus90,
       time('2024-03-10 23:59:30', '+45 seconds') AS t,
       julianday('2024-01-01') - julianday('2000-01-01') AS days,
       strftime('%Y-%j %w %H:%M:%S', '2021-07-04 08:09:10') AS fmt,
       date('2024-01-31', '+1 month') AS month_overflow,
       date('2024-05-15', 'start of month', '+1 month', '-1 day') AS end_of_month,
       unixepoch('2000-01-01 00:00:00') AS epoch,
       datetime(1700000000, 'unixepoch') AS from_epoch,
       date('2024-06-13', 'weekday 0') AS next_sunday;

SELECT strftime('%Y-%m', hired) AS month, count(*) AS n
FROM employees WHERE hired BETWEEN '2015-01-01' AND '2015-06-30'
GROUP BY month ORDER BY month;

SELECT emp_id, hired,
       cast((julianday('2025-01-01') - julianday(hired)) / 365.25 AS INTEGER) AS years_at_2025
FROM employees WHERE emp_id % 1000 = 0 ORDER BY emp_id;

SELECT '== 15. strings ==' AS section;

SELECT printf('%5d|%-8s|%08.3f|%x|%o|%e|%c|%q|%Q|%%', 42, 'ab', 3.14159, 255, 8, 12345.678, 'xyz', 'it''s', NULL) AS pf,
       format('%s has %d items', 'cart', 3) AS fmt,
       substr('Hello, World', 8) AS sub1, substr('Hello, World', -5, 3) AS sub2,
       replace('a-b-c-d', '-', '+') AS rep, upper('mixed Case') AS up, lower('MiXeD') AS lo,
       instr('bunkai scatter', 'scat') AS pos, hex('SQLite') AS hx, hex(zeroblob(3)) AS zb,
       length('héllo') AS len_chars, length(cast('héllo' AS BLOB)) AS len_bytes,
       trim('  pad  ') AS tr, ltrim('xxabcxx', 'x') AS lt, rtrim('xxabcxx', 'x') AS rt,
       quote('O''Brien') AS qt, char(72, 105) AS ch, unicode('é') AS uni,
       'abc' || 123 || NULL AS concat_null, 'abc' LIKE 'A%' AS like_ci, 'abc' GLOB 'A*' AS glob_cs,
       reverse_free.s AS nested
FROM (SELECT group_concat(c, '') AS s FROM (SELECT 'z' AS c UNION ALL SELECT 'y' UNION ALL SELECT 'x')) AS reverse_free;

SELECT last, upper(substr(first, 1, 1)) || '.' AS initial, length(email) AS elen,
       printf('%-10s|%6.2f%%', last, 100.0 * salary / 120000) AS formatted
FROM employees WHERE emp_id BETWEEN 20 AND 29 ORDER BY emp_id;

SELECT '== 16. CASE ==' AS section;

SELECT CASE WHEN salary >= 100000 THEN 'A' WHEN salary >= 70000 THEN 'B'
            WHEN salary >= 45000 THEN 'C' ELSE 'D' END AS band,
       count(*) AS n, min(salary) AS lo, max(salary) AS hi
FROM employees GROUP BY band ORDER BY band;

SELECT region, CASE region WHEN 'north' THEN 1 WHEN 'south' THEN 2 ELSE 3 END AS code,
       iif(budget > 300000, 'big', 'small') AS size, coalesce(NULL, nullif(region, 'west'), 'none') AS nz
FROM departments ORDER BY dept_id;

SELECT '== 17. UPSERT ==' AS section;

INSERT INTO inventory(sku, qty, price) VALUES ('SKU-0001', 10, 9.99)
  ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty, updates = updates + 1;
INSERT INTO inventory(sku, qty, price) VALUES ('SKU-9999', 5, 1.00)
  ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty, updates = updates + 1;
INSERT INTO inventory(sku, qty, price) VALUES ('SKU-0002', 1, 1.00)
  ON CONFLICT(sku) DO NOTHING;
INSERT INTO inventory(sku, qty, price)
  SELECT sku, 100, price FROM inventory WHERE sku BETWEEN 'SKU-0003' AND 'SKU-0006'
  ON CONFLICT(sku) DO UPDATE SET qty = qty + excluded.qty, updates = updates + 1
  WHERE excluded.qty > 50;
INSERT OR REPLACE INTO inventory(sku, qty, price) VALUES ('SKU-0007', 0, 0.5);
REPLACE INTO inventory(sku, qty, price) VALUES ('SKU-0008', 8, 8.0);
SELECT * FROM inventory WHERE sku IN ('SKU-0001','SKU-0002','SKU-0003','SKU-0006','SKU-0007','SKU-0008','SKU-9999')
ORDER BY sku;

UPDATE inventory SET price = round(price * 1.1, 2) WHERE sku <= 'SKU-0005' RETURNING sku, price;
DELETE FROM inventory WHERE qty = 0 AND sku > 'SKU-0150' RETURNING sku;

SELECT '== 18. triggers at work ==' AS section;

UPDATE employees SET salary = salary + 1000 WHERE emp_id IN (10, 20, 30);
UPDATE employees SET salary = salary WHERE emp_id = 40;        -- no change, trigger WHEN false
DELETE FROM employees WHERE emp_id IN (4998, 4999);
SELECT id, action, tbl, row_id, detail FROM audit_log ORDER BY id;
SELECT count(*) AS asg_left_for_deleted FROM assignments WHERE emp_id IN (4998, 4999);
SELECT proj_id, round(cost, 1) AS cost FROM projects ORDER BY proj_id LIMIT 5;

SELECT '== 19. transactions and savepoints ==' AS section;

BEGIN;
INSERT INTO ledger(account, amount, note) VALUES ('cash', 100, 'opening');
SAVEPOINT sp1;
INSERT INTO ledger(account, amount, note) VALUES ('cash', -30, 'coffee');
SAVEPOINT sp2;
INSERT INTO ledger(account, amount, note) VALUES ('cash', -500, 'mistake');
ROLLBACK TO sp2;
INSERT INTO ledger(account, amount, note) VALUES ('bank', 250, 'salary');
RELEASE sp1;
COMMIT;
SELECT * FROM ledger ORDER BY id;

BEGIN;
INSERT INTO ledger(account, amount, note) VALUES ('cash', 999, 'rolled back');
ROLLBACK;
SELECT account, sum(amount) AS balance FROM ledger GROUP BY account ORDER BY account;

SAVEPOINT outer_sp;
UPDATE ledger SET amount = amount * 2;
SELECT sum(amount) AS doubled FROM ledger;
ROLLBACK TO outer_sp;
RELEASE outer_sp;
SELECT sum(amount) AS restored FROM ledger;

SELECT '== 20. ATTACH ==' AS section;

ATTACH ':memory:' AS aux;
CREATE TABLE aux.summary AS
SELECT dept_id, count(*) AS staff, sum(salary) AS payroll FROM main.employees GROUP BY dept_id;
CREATE TABLE aux.notes2 (k TEXT PRIMARY KEY, v INTEGER);
INSERT INTO aux.notes2 VALUES ('a', 1), ('b', 2), ('c', 3);
SELECT name FROM pragma_database_list WHERE name <> 'temp' ORDER BY seq;
SELECT s.dept_id, d.name, s.staff, s.payroll
FROM aux.summary s JOIN main.departments d USING (dept_id) ORDER BY s.dept_id;
SELECT name FROM aux.sqlite_schema ORDER BY name;
DETACH aux;

SELECT '== 21. pragmas ==' AS section;

PRAGMA integrity_check;
PRAGMA foreign_key_check;
PRAGMA quick_check;
SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info('employees') ORDER BY cid;
SELECT name, "unique", origin, partial FROM pragma_index_list('employees') ORDER BY name;
SELECT "table", "from", "to", on_delete FROM pragma_foreign_key_list('assignments') ORDER BY id;
PRAGMA foreign_keys;
PRAGMA encoding;

SELECT '== 22. EXPLAIN QUERY PLAN ==' AS section;

EXPLAIN QUERY PLAN SELECT * FROM employees WHERE dept_id = 3 ORDER BY salary DESC;
EXPLAIN QUERY PLAN SELECT e.first, p.title FROM employees e
  JOIN assignments a ON a.emp_id = e.emp_id JOIN projects p ON p.proj_id = a.proj_id
  WHERE p.proj_id = 7;
EXPLAIN QUERY PLAN SELECT * FROM employees WHERE salary > 110000;
EXPLAIN QUERY PLAN SELECT count(*) FROM employees WHERE substr(hired, 1, 4) = '2012';

SELECT '== 23. output modes ==' AS section;

.mode csv
SELECT dept_id, name, region, budget FROM departments WHERE dept_id <= 4 ORDER BY dept_id;
SELECT 'has,comma' AS a, 'has "quote"' AS b, NULL AS c;
.mode column
SELECT dept_id, name, region, budget FROM departments WHERE dept_id <= 4 ORDER BY dept_id;
.mode json
SELECT dept_id, name, region, budget FROM departments WHERE dept_id <= 4 ORDER BY dept_id;
.mode box
SELECT dept_id, name, region, budget FROM departments WHERE dept_id <= 4 ORDER BY dept_id;
.mode line
SELECT emp_id, first, last FROM employees WHERE emp_id = 1;
.mode tabs
SELECT sku, qty FROM inventory ORDER BY sku LIMIT 3;
.mode markdown
SELECT sku, qty FROM inventory ORDER BY sku LIMIT 3;
.mode insert ledger
SELECT id, account, amount, note FROM ledger ORDER BY id;
.headers off
.mode list
.separator " | "
SELECT sku, qty, price FROM inventory ORDER BY sku LIMIT 3;
.separator "|"
.headers on

SELECT '== 24. expected errors (messages on stderr) ==' AS section;

-- EXPECTED ERROR 1: syntax error
SELEC * FROM employees;
-- EXPECTED ERROR 2: no such table
SELECT * FROM no_such_table;
-- EXPECTED ERROR 3: UNIQUE constraint
INSERT INTO departments(dept_id, name, budget) VALUES (99, 'Dept-A', 1);
-- EXPECTED ERROR 4: NOT NULL constraint
INSERT INTO employees(emp_id, dept_id, first, last, email, salary, hired)
VALUES (9001, 1, NULL, 'X', 'x@example.org', 1000, '2020-01-01');
-- EXPECTED ERROR 5: CHECK constraint
INSERT INTO departments(dept_id, name, budget) VALUES (98, 'Negative', -5);
-- EXPECTED ERROR 6: FOREIGN KEY constraint (foreign_keys is ON)
INSERT INTO employees(emp_id, dept_id, first, last, email, salary, hired)
VALUES (9002, 777, 'No', 'Dept', 'nodept@example.org', 1000, '2020-01-01');
-- EXPECTED ERROR 7: type mismatch in a STRICT table
INSERT INTO ledger(account, amount, note) VALUES ('cash', 'ten', 'bad');
-- EXPECTED ERROR 8: RAISE(ABORT) from a trigger
INSERT INTO ledger(account, amount, note) VALUES ('cash', 0, 'zero');
-- EXPECTED ERROR 9: no such column
SELECT no_such_column FROM departments;
-- EXPECTED ERROR 10: wrong number of arguments
SELECT substr();
-- EXPECTED ERROR 11: malformed JSON
SELECT json_extract('{not json', '$.a');
-- EXPECTED ERROR 12: PRIMARY KEY violation on a WITHOUT ROWID table
INSERT INTO assignments(emp_id, proj_id, hours)
SELECT emp_id, proj_id, hours FROM assignments ORDER BY emp_id, proj_id LIMIT 1;
-- EXPECTED ERROR 13: CHECK via json_valid
INSERT INTO docs(id, body) VALUES (100, 'nope');
-- EXPECTED ERROR 14: cannot modify a view
DELETE FROM v_dept_stats;
-- EXPECTED ERROR 15: fts5 syntax error
SELECT count(*) FROM notes WHERE notes MATCH 'AND AND';
-- EXPECTED ERROR 16: inside a transaction; the statement fails, the transaction continues
BEGIN;
INSERT INTO ledger(account, amount, note) VALUES ('cash', 1, 'kept');
INSERT INTO ledger(account, amount, note) VALUES (NULL, 1, 'lost');
COMMIT;

SELECT 'still running after errors' AS status;
SELECT count(*) AS ledger_rows, sum(amount) AS total FROM ledger;
SELECT count(*) AS departments FROM departments;
SELECT count(*) AS employees FROM employees;
PRAGMA foreign_key_check;

SELECT '== 25. recursive CTEs ==' AS section;

-- management chain up from one employee
WITH RECURSIVE chain(emp_id, manager_id, depth) AS (
    SELECT emp_id, manager_id, 0 FROM employees WHERE emp_id = 4321
    UNION ALL
    SELECT e.emp_id, e.manager_id, c.depth + 1
    FROM employees e JOIN chain c ON e.emp_id = c.manager_id
    WHERE c.depth < 10
)
SELECT emp_id, manager_id, depth FROM chain ORDER BY depth;

-- Fibonacci and a Collatz run
WITH RECURSIVE fib(i, a, b) AS (SELECT 1, 0, 1 UNION ALL SELECT i + 1, b, a + b FROM fib WHERE i < 30)
SELECT group_concat(a, ' ') AS fib FROM (SELECT a FROM fib ORDER BY i);
WITH RECURSIVE c(n, steps) AS (SELECT 27, 0 UNION ALL
    SELECT CASE WHEN n % 2 = 0 THEN n / 2 ELSE 3 * n + 1 END, steps + 1 FROM c WHERE n <> 1)
SELECT max(steps) AS collatz27_steps, max(n) AS peak FROM c;

-- Mandelbrot (the classic SQLite demo), deterministic ASCII art
WITH RECURSIVE
  xaxis(x) AS (VALUES(-2.0) UNION ALL SELECT x + 0.05 FROM xaxis WHERE x < 1.2),
  yaxis(y) AS (VALUES(-1.0) UNION ALL SELECT y + 0.1 FROM yaxis WHERE y < 1.0),
  m(iter, cx, cy, x, y) AS (
    SELECT 0, x, y, 0.0, 0.0 FROM xaxis, yaxis
    UNION ALL
    SELECT iter + 1, cx, cy, x * x - y * y + cx, 2.0 * x * y + cy FROM m
     WHERE (x * x + y * y) < 4.0 AND iter < 28
  ),
  m2(iter, cx, cy) AS (SELECT max(iter), cx, cy FROM m GROUP BY cx, cy),
  a(t) AS (
    SELECT group_concat(substr(' .+*#', 1 + min(iter / 7, 4), 1), '')
    FROM (SELECT * FROM m2 ORDER BY cy, cx) GROUP BY cy
  )
SELECT group_concat(rtrim(t), x'0a') AS mandelbrot FROM a;

SELECT '== 26. misc: generate_series, values, compound selects ==' AS section;

SELECT value, value * value AS sq FROM generate_series(1, 10, 3) ORDER BY value;
SELECT 'a' AS s UNION SELECT 'b' UNION SELECT 'a' ORDER BY s;
SELECT dept_id FROM employees WHERE emp_id < 30
INTERSECT SELECT dept_id FROM projects WHERE proj_id < 10 ORDER BY 1;
SELECT dept_id FROM departments EXCEPT SELECT dept_id FROM projects ORDER BY 1;
SELECT * FROM (VALUES (3, 'c'), (1, 'a'), (2, 'b')) ORDER BY 1;
SELECT name, count(*) AS pages, sum(ncell) AS cells FROM dbstat
 WHERE name IN ('departments', 'ledger', 'inventory') GROUP BY name ORDER BY name;

SELECT '== 27. final checks ==' AS section;

VACUUM;
PRAGMA integrity_check;
SELECT count(*) AS audit_rows FROM audit_log;
SELECT sum(salary) AS payroll, count(*) AS staff, min(hired) AS first, max(hired) AS last FROM employees;
SELECT sum((emp_id * 131 + salary * 7 + unicode(substr(hired, 9)) + length(email)) % 1000003) AS emp_checksum,
       sum(length(body)) AS notes_len, (SELECT sum(hours) FROM assignments) AS hours
FROM employees, (SELECT sum(length(body)) AS body FROM notes);
SELECT total_changes() AS total_changes;
SELECT 'done' AS status;
