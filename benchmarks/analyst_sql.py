"""What a new analyst meets (issue 37): a list of statements that analysts and BI tools write against the demo
data, each sent through `dpsql.connect`, sorted into answered, refused and failed, with each refusal's code,
message and hint. The list is ours and public; the issue's own lists are kept outside the project so that they
measure rather than steer, so read this as a guide to what is left, not as the issue's target.

    python benchmarks/analyst_sql.py [--people 5000] [--out FILE]

Statements marked `raw` ask for rows of private data and must be refused; those marked `bad` hold a literal that
PostgreSQL cannot read and must fail with its SQLSTATE, charged nothing. Results: benchmarks/results/analyst_sql.md.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_engine import _analyst as bench_analyst  # noqa: E402 - benchmarks/ is on sys.path as a script

import dpsql  # noqa: E402
from dpsql.demo import load_demo_data  # noqa: E402
from dpsql.embedded import EmbeddedPostgres  # noqa: E402

SCHEMA = Path(__file__).resolve().parent.parent / "dpsql" / "schemas" / "demo.toml"
RESULTS = Path(__file__).resolve().parent / "results" / "analyst_sql.md"

MONTHLY = "SELECT date_trunc('month', day) AS month, COUNT(*) AS n FROM visits GROUP BY 1"
STATEMENTS: list[tuple[str, str]] = [  # (what is expected: answer, raw or bad; the statement)
    ("answer", "SELECT COUNT(*) FROM people"),
    ("answer", "SELECT COUNT(1) FROM visits"),
    ("answer", "SELECT COUNT(age) FROM people"),
    ("answer", "SELECT SUM(1) FROM people"),
    ("answer", "SELECT AVG(age) FROM people"),
    ("answer", "SELECT MIN(age), MAX(age) FROM people"),
    ("answer", "SELECT sex, COUNT(*) FROM people GROUP BY sex"),
    ("answer", "SELECT state, COUNT(*) FROM people GROUP BY state ORDER BY 2 DESC"),
    ("answer", "SELECT state, AVG(income) FROM people GROUP BY state ORDER BY state"),
    ("answer", "SELECT sex, state, COUNT(*) FROM people GROUP BY sex, state"),
    ("answer", "SELECT age, COUNT(*) FROM people GROUP BY age ORDER BY age"),
    ("answer", "SELECT category, SUM(amount) FROM visits GROUP BY category"),
    ("answer", "SELECT category, AVG(amount), STDDEV(amount) FROM visits GROUP BY category"),
    ("answer", "SELECT VARIANCE(income), stddev_samp(income), var_pop(income) FROM people"),
    ("answer", "SELECT AVG(amount) FROM visits WHERE category = 'dental'"),
    ("answer", MONTHLY + " ORDER BY 1"),
    ("answer", "SELECT EXTRACT(quarter FROM day) AS q, COUNT(*) FROM visits GROUP BY q ORDER BY q"),
    ("answer", "SELECT to_char(day, 'YYYY-MM') AS m, COUNT(*) FROM visits GROUP BY m ORDER BY m"),
    ("answer", "SELECT date_part('dow', day) AS dow, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT EXTRACT(year FROM day), EXTRACT(month FROM day), COUNT(*) FROM visits GROUP BY 1, 2 "
               "ORDER BY 1, 2"),
    ("answer", "SELECT date_trunc('week', day)::date AS wk, SUM(amount) FROM visits GROUP BY wk ORDER BY wk"),
    ("answer", "SELECT to_char(day, 'Day') AS weekday, COUNT(*) FROM visits GROUP BY 1"),
    ("answer", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY income) FROM people"),
    ("answer", "SELECT category, percentile_cont(0.9) WITHIN GROUP (ORDER BY amount) FROM visits GROUP BY category"),
    ("answer", "SELECT percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY age) FROM people"),
    ("answer", "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY day) FROM visits"),
    ("answer", "SELECT mode() WITHIN GROUP (ORDER BY category) FROM visits"),
    ("answer", "SELECT COUNT(DISTINCT person_id) FROM visits"),
    ("answer", "SELECT category, COUNT(DISTINCT person_id) FROM visits GROUP BY category"),
    ("answer", "SELECT COUNT(DISTINCT category) FROM visits"),
    ("answer", "SELECT COUNT(DISTINCT state) FROM people"),
    ("answer", "SELECT COUNT(*) FROM (SELECT DISTINCT person_id FROM visits WHERE category = 'dental') t"),
    ("answer", "SELECT p.state, COUNT(*) FROM visits v JOIN people p ON v.person_id = p.person_id GROUP BY p.state"),
    ("answer", "SELECT p.sex, AVG(v.amount) FROM visits v JOIN people p USING (person_id) GROUP BY p.sex"),
    ("answer", "SELECT s.region, COUNT(*) FROM people p JOIN states s ON p.state = s.code GROUP BY s.region"),
    ("answer", "SELECT s.name, COUNT(p.person_id) FROM states s LEFT JOIN people p ON p.state = s.code "
               "GROUP BY s.name"),
    ("answer", "SELECT CASE WHEN age < 18 THEN 'minor' WHEN age < 65 THEN 'adult' ELSE 'senior' END AS band, "
               "COUNT(*) FROM people GROUP BY 1"),
    ("answer", "SELECT width_bucket(age, 0, 100, 10) AS b, COUNT(*) FROM people GROUP BY b ORDER BY b"),
    ("answer", "SELECT floor(age / 10) * 10 AS decade, COUNT(*) FROM people GROUP BY decade ORDER BY decade"),
    ("answer", "SELECT age / 10 * 10 AS bucket, AVG(income) FROM people GROUP BY bucket ORDER BY bucket"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day BETWEEN '2024-03-01' AND '2024-03-31'"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-12-31' - INTERVAL '30 days'"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day >= DATE '2024-12-31' - INTERVAL '3 months'"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day + 7 < DATE '2024-02-01'"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day >= now() - INTERVAL '1 year'"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day = CURRENT_DATE - 1"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE EXTRACT(month FROM day) = 7"),
    ("answer", "SELECT category, COUNT(*) FROM visits WHERE day >= date_trunc('month', DATE '2024-06-15') "
               "GROUP BY category"),
    ("answer", "SELECT COUNT(*) FROM people WHERE state IN ('CA', 'NY', 'TX')"),
    ("answer", "SELECT COUNT(*) FROM people WHERE state = ANY(ARRAY['CA', 'NY'])"),
    ("answer", "SELECT COUNT(*) FROM people WHERE state LIKE 'N%'"),
    ("answer", "SELECT COUNT(*) FROM people WHERE income IS NULL"),
    ("answer", "SELECT COUNT(*) FROM people WHERE age BETWEEN 30 AND 40 AND sex = 'F'"),
    ("answer", "SELECT COALESCE(state, 'unknown'), COUNT(*) FROM people GROUP BY 1"),
    ("answer", "SELECT upper(state), COUNT(*) FROM people GROUP BY 1"),
    ("answer", "SELECT concat(sex, '-', state), COUNT(*) FROM people GROUP BY 1"),
    ("answer", "SELECT COUNT(*) FILTER (WHERE sex = 'F') AS women, COUNT(*) FILTER (WHERE sex = 'M') AS men "
               "FROM people"),
    ("answer", "SELECT sex, AVG(age) FILTER (WHERE income > 100000) FROM people GROUP BY sex"),
    ("answer", "SELECT SUM(CASE WHEN category = 'dental' THEN amount ELSE 0 END) FROM visits"),
    ("answer", "SELECT SUM(amount) FILTER (WHERE day < '2024-07-01') AS h1, SUM(amount) FILTER (WHERE day >= "
               "'2024-07-01') AS h2 FROM visits"),
    ("answer", "SELECT AVG(age) FILTER (WHERE sex = 'F') - AVG(age) FILTER (WHERE sex = 'M') FROM people"),
    ("answer", "SELECT ROUND(AVG(income)::numeric, 2) FROM people"),
    ("answer", "SELECT AVG(income)::int FROM people"),
    ("answer", "SELECT COUNT(*)::float / 3000 FROM people"),
    ("answer", "SELECT corr(age, income) FROM people"),
    ("answer", "SELECT regr_slope(income, age) FROM people"),
    ("answer", "SELECT category, MAX(day) FROM visits GROUP BY category"),
    ("answer", "SELECT category FROM visits GROUP BY category HAVING COUNT(*) > 100"),
    ("answer", "SELECT state, COUNT(*) FROM people GROUP BY state HAVING AVG(income) > 50000"),
    ("answer", "SELECT category, COUNT(*) FROM visits GROUP BY category ORDER BY 2 DESC LIMIT 3"),
    ("answer", "SELECT category, COUNT(*) AS n FROM visits GROUP BY category ORDER BY n DESC NULLS LAST"),
    ("answer", "SELECT sex, COUNT(*) * 100.0 / SUM(COUNT(*)) OVER () AS pct FROM people GROUP BY sex"),
    ("answer", "SELECT category, COUNT(*), rank() OVER (ORDER BY COUNT(*) DESC) FROM visits GROUP BY category"),
    ("answer", "SELECT category, n, rank() OVER (ORDER BY n DESC) FROM (SELECT category, COUNT(*) AS n FROM visits "
               "GROUP BY category) t"),
    ("answer", "SELECT category, SUM(amount) * 1.0 / SUM(SUM(amount)) OVER () FROM visits GROUP BY category"),
    ("answer", f"SELECT month, n, n - LAG(n) OVER (ORDER BY month) AS change FROM ({MONTHLY}) t ORDER BY month"),
    ("answer", f"SELECT month, SUM(n) OVER (ORDER BY month) AS cumulative FROM ({MONTHLY}) t ORDER BY month"),
    ("answer", "WITH per_person AS (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) "
               "SELECT AVG(n) FROM per_person"),
    ("answer", "SELECT n_visits, COUNT(*) FROM (SELECT person_id, COUNT(*) AS n_visits FROM visits "
               "GROUP BY person_id) t GROUP BY n_visits ORDER BY n_visits"),
    ("answer", "SELECT COUNT(*) FROM people p WHERE EXISTS (SELECT 1 FROM visits v WHERE v.person_id = p.person_id "
               "AND v.category = 'emergency')"),
    ("answer", "SELECT COUNT(*) FROM people WHERE person_id IN (SELECT person_id FROM visits WHERE category = 'lab')"),
    ("answer", "SELECT COUNT(*) FROM people p LEFT JOIN visits v ON p.person_id = v.person_id "
               "WHERE v.visit_id IS NULL"),
    ("answer", "SELECT AVG(age) FROM people WHERE person_id IN (SELECT person_id FROM visits GROUP BY person_id "
               "HAVING COUNT(*) > 5)"),
    ("answer", "SELECT COUNT(*) FROM people p JOIN (SELECT person_id FROM visits GROUP BY person_id "
               "HAVING SUM(amount) > 1000) big ON big.person_id = p.person_id"),
    ("answer", "SELECT category, AVG(amount) FROM visits WHERE person_id IN (SELECT person_id FROM people "
               "WHERE age > 65) GROUP BY category"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE amount > (SELECT AVG(amount) FROM visits)"),
    ("answer", "SELECT (SELECT COUNT(*) FROM visits)::float / (SELECT COUNT(*) FROM people) AS visits_per_person"),
    ("answer", "SELECT SUM(amount) / COUNT(DISTINCT person_id) FROM visits"),
    ("answer", "SELECT drug, COUNT(*) FROM prescriptions GROUP BY drug ORDER BY 2 DESC"),
    ("answer", "SELECT drug, SUM(cost) FROM prescriptions GROUP BY drug"),
    ("answer", "SELECT AVG(cost) FROM prescriptions WHERE drug = 'insulin'"),
    ("answer", "SELECT v.category, pr.drug, COUNT(*) FROM prescriptions pr JOIN visits v "
               "ON pr.visit_id = v.visit_id GROUP BY 1, 2"),
    ("answer", "SELECT p.state, SUM(pr.cost) FROM prescriptions pr JOIN visits v ON pr.visit_id = v.visit_id "
               "JOIN people p ON v.person_id = p.person_id GROUP BY p.state"),
    ("answer", "SELECT category, COUNT(*) FROM visits WHERE NOT category = 'lab' GROUP BY ROLLUP(category)"),
    ("answer", "SELECT COALESCE(category, 'All categories') AS category, COUNT(*) FROM visits "
               "GROUP BY ROLLUP (category)"),
    ("answer", "SELECT CASE WHEN GROUPING(sex) = 1 THEN 'Total' ELSE sex END AS sex, AVG(income) FROM people "
               "GROUP BY ROLLUP (sex)"),
    ("answer", "SELECT sex, state, COUNT(*) FROM people GROUP BY GROUPING SETS ((sex), (state))"),
    ("answer", "SELECT category, SUM(amount) FROM visits GROUP BY CUBE(category)"),
    ("answer", "SELECT DISTINCT category FROM visits"),
    ("answer", "SELECT DISTINCT state FROM people"),
    ("answer", "SELECT smoker, COUNT(*) FROM survey GROUP BY smoker"),
    ("answer", "SELECT COUNT(*) FROM screenings WHERE positive"),
    ("answer", 'SELECT COUNT(*) AS "Number of People" FROM "people"'),
    ("answer", 'SELECT "public"."people"."state" AS "state", count(*) AS "count" FROM "public"."people" '
               'GROUP BY "public"."people"."state" ORDER BY "public"."people"."state" ASC'),
    ("answer", "SELECT category AS category, AVG(amount) AS \"AVG(amount)\" FROM public.visits WHERE day >= "
               "TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') AND day < "
               "TO_TIMESTAMP('2024-07-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') GROUP BY category "
               "ORDER BY \"AVG(amount)\" DESC LIMIT 10000"),
    ("answer", 'SELECT "people"."sex" AS "sex", SUM(1) AS "cnt:people:ok" FROM "public"."people" "people" '
               "GROUP BY 1"),
    ("answer", "SELECT date_trunc('day', day) AS \"time\", COUNT(*) AS \"visits\" FROM visits WHERE day BETWEEN "
               "'2024-01-01T00:00:00Z' AND '2024-06-30T00:00:00Z' GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT COUNT(*) FROM visits TABLESAMPLE BERNOULLI (10)"),
    ("answer", "SELECT bool_or(amount > 4000) FROM visits"),
    ("answer", "SELECT COUNT(*) FROM people p WHERE (SELECT COUNT(*) FROM visits v WHERE v.person_id = p.person_id) "
               ">= 10"),
    ("answer", "SELECT DISTINCT category FROM visits WHERE day >= '2024-06-01'"),
    ("answer", "SELECT approx_count_distinct(person_id) FROM visits"),
    ("answer", "SELECT category, bool_and(amount > 10), every(amount < 5000) FROM visits GROUP BY category"),
    ("answer", "SELECT COUNT(*) FROM survey WHERE smoker"),
    ("answer", 'SELECT "source"."category" AS "category", "source"."count" AS "count" FROM (SELECT '
               '"public"."visits"."category" AS "category", count(*) AS "count" FROM "public"."visits" GROUP BY '
               '"public"."visits"."category" ORDER BY "public"."visits"."category" ASC) "source" LIMIT 1048575'),
    ("answer", "SELECT DATE_TRUNC('month', day) AS __timestamp, category AS category, COUNT(*) AS count FROM "
               "public.visits JOIN (SELECT category AS category__, COUNT(*) AS mme_inner__ FROM public.visits GROUP BY "
               "category ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit ON category = category__ GROUP BY "
               "DATE_TRUNC('month', day), category LIMIT 10000"),
    ("answer", "SELECT COUNT(*) FROM (SELECT person_id FROM visits GROUP BY person_id HAVING COUNT(*) >= 3) t"),
    ("answer", "SELECT AVG(spent) FROM (SELECT person_id, SUM(amount) AS spent FROM visits GROUP BY person_id) t"),
    ("answer", f"WITH m AS ({MONTHLY}) SELECT month, n, AVG(n) OVER (ORDER BY month ROWS BETWEEN 2 PRECEDING AND "
               "CURRENT ROW) AS moving FROM m ORDER BY month"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day >= date_trunc('month', DATE '2024-07-15') - INTERVAL '1 month'"),
    ("answer", "SELECT COUNT(*) FROM people WHERE state IS DISTINCT FROM 'CA'"),
    ("answer", "SELECT AVG((sex = 'F')::int) FROM people"),
    ("answer", "SELECT category, SUM(amount) FROM visits GROUP BY 1 ORDER BY 2 DESC FETCH FIRST 3 ROWS ONLY"),
    ("answer", "SELECT regr_r2(income, age), regr_count(income, age) FROM people"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE category = 'lab' AND person_id IN (SELECT person_id FROM visits "
               "WHERE category = 'dental')"),
    ("answer", "SELECT region, COUNT(*) FROM survey GROUP BY region"),
    ("answer", 'SELECT SUM(CAST(1 AS BIGINT)) AS "cnt:visits:ok" FROM "public"."visits" "visits"'),
    ("answer", "SELECT COUNT(*) FROM people p WHERE (SELECT COUNT(*) FROM visits WHERE person_id = p.person_id) > 5"),
    ("answer", "SELECT drug, COUNT(DISTINCT visit_id) FROM prescriptions GROUP BY drug"),
    ("answer", 'SELECT "People"."sex" AS "People__sex", count(*) AS "count" FROM "public"."visits" LEFT JOIN '
               '"public"."people" AS "People" ON "public"."visits"."person_id" = "People"."person_id" GROUP BY '
               '"People"."sex" ORDER BY "People"."sex" ASC'),
    ("answer", 'SELECT (date_trunc(\'week\', ("public"."visits"."day" + INTERVAL \'1 day\')) - INTERVAL \'1 day\') '
               'AS "day", count(*) AS "count" FROM "public"."visits" GROUP BY 1 ORDER BY 1 ASC'),
    ("answer", "SELECT AVG(t.total) FROM (SELECT person_id, SUM(amount) AS total FROM visits GROUP BY 1) t"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day BETWEEN make_date(2024, 1, 1) AND make_date(2024, 3, 31)"),
    ("answer", "SELECT category, COUNT(*) FROM visits WHERE category ~* '^(lab|dent)' GROUP BY 1"),
    ("answer", "SELECT COUNT(*) FROM people WHERE state SIMILAR TO '(C|N)%'"),
    ("answer", 'SELECT extract(epoch from day) * 1000 AS "time", SUM(amount) AS "spent" FROM visits GROUP BY 1 '
               'ORDER BY 1'),
    ("answer", "SELECT date_trunc('month', day) AS month, COUNT(DISTINCT day) AS days_open FROM visits GROUP BY 1"),
    ("answer", "WITH a AS (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id), b AS (SELECT n, COUNT(*) "
               "AS people FROM a GROUP BY n) SELECT * FROM b ORDER BY n LIMIT 10"),
    ("answer", "SELECT category, COUNT(*) / COUNT(DISTINCT person_id) AS visits_per_person FROM visits GROUP BY 1"),
    ("answer", "SELECT to_char(date_trunc('month', day), 'Mon YYYY') AS m, COUNT(*) FROM visits GROUP BY "
               "date_trunc('month', day) ORDER BY date_trunc('month', day)"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE day > (SELECT MAX(day) FROM visits) - INTERVAL '30 days'"),
    ("answer", "WITH firsts AS (SELECT person_id, MIN(day) AS first_day FROM visits GROUP BY person_id) "
               "SELECT date_trunc('month', first_day) AS cohort, COUNT(*) FROM firsts GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT sex, AVG(n) FROM (SELECT p.person_id, p.sex, COUNT(v.visit_id) AS n FROM people p "
               "LEFT JOIN visits v ON v.person_id = p.person_id GROUP BY p.person_id, p.sex) t GROUP BY sex"),
    ("answer", "SELECT state, COUNT(*), AVG(income) FROM people WHERE state IN ('CA', 'NY', 'WY') GROUP BY state"),
    ("answer", "SELECT category, drug, n FROM (SELECT v.category, r.drug, COUNT(*) AS n, ROW_NUMBER() OVER ("
               "PARTITION BY v.category ORDER BY COUNT(*) DESC) AS rn FROM prescriptions r JOIN visits v ON "
               "v.visit_id = r.visit_id GROUP BY 1, 2) t WHERE rn <= 2 ORDER BY 1, 3 DESC"),
    ("answer", "WITH a AS (SELECT category, COUNT(*) AS n FROM visits GROUP BY category), b AS (SELECT category, "
               "SUM(amount) AS s FROM visits GROUP BY category) SELECT a.category, a.n, b.s FROM a JOIN b ON "
               "a.category = b.category"),
    ("answer", "SELECT category, to_char(SUM(amount), 'FM999,999,990') AS total, COUNT(*) || ' visits' AS n "
               "FROM visits GROUP BY category ORDER BY 1"),
    ("answer", "SELECT d::date AS day, COUNT(v.visit_id) FROM generate_series(DATE '2024-01-01', DATE '2024-01-31', "
               "INTERVAL '1 day') d LEFT JOIN visits v ON v.day = d::date GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT c.k, COUNT(v.visit_id) FROM (VALUES ('checkup'), ('dental')) AS c(k) LEFT JOIN visits v "
               "ON v.category = c.k GROUP BY c.k"),
    ("answer", "SELECT s.name, COUNT(p.person_id) FROM states s LEFT JOIN people p ON p.state = s.code "
               "GROUP BY s.name ORDER BY 2 DESC"),
    ("answer", "SELECT category, COUNT(*) FROM visits GROUP BY category ORDER BY 2 DESC LIMIT ALL"),
    # a per-unit subquery joined to the unit's own row (stop 58)
    ("answer", "SELECT p.sex, AVG(t.spend) FROM people p JOIN (SELECT person_id, SUM(amount) AS spend FROM visits "
               "GROUP BY person_id) t ON t.person_id = p.person_id GROUP BY p.sex"),
    ("answer", "SELECT s.region, AVG(t.n) FROM (SELECT person_id, COUNT(*) AS n FROM visits GROUP BY person_id) t "
               "JOIN people p ON p.person_id = t.person_id JOIN states s ON s.code = p.state GROUP BY 1"),
    ("answer", "SELECT AVG(COALESCE(t.n, 0)) FROM people p LEFT JOIN (SELECT person_id, COUNT(*) AS n FROM visits "
               "GROUP BY person_id) t ON t.person_id = p.person_id"),
    ("answer", "SELECT bucket, COUNT(*) FROM (SELECT p.person_id, CASE WHEN COUNT(v.visit_id) = 0 THEN '0' "
               "WHEN COUNT(v.visit_id) < 5 THEN '1-4' ELSE '5+' END AS bucket FROM people p LEFT JOIN visits v "
               "ON v.person_id = p.person_id GROUP BY p.person_id) t GROUP BY 1 ORDER BY 1"),
    # days between dates, and dates plus days (stop 58)
    ("answer", "SELECT category, AVG(CURRENT_DATE - day) AS days_ago FROM visits GROUP BY 1"),
    ("answer", "SELECT AVG(last_day - first_day) FROM (SELECT person_id, MIN(day) AS first_day, MAX(day) AS "
               "last_day FROM visits GROUP BY person_id) t"),
    ("answer", "SELECT date_trunc('week', day + 1)::date AS wk, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1"),
    # spellings (stop 58)
    ("answer", "SELECT COUNT(*) FROM visits WHERE category = ANY('{lab,dental}')"),
    ("answer", "SELECT DATE(day) AS d, COUNT(*) FROM visits WHERE day < '2024-01-10' GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT category, AVG(amount) AS a FROM visits GROUP BY category HAVING AVG(amount) BETWEEN 50 "
               "AND 500"),
    ("answer", "SELECT amount > 100 AS big, COUNT(*) FROM visits GROUP BY 1"),
    ("answer", "SELECT diet, COUNT(*) FROM survey GROUP BY diet ORDER BY 2 DESC"),
    # found by the 2026-11-27 batches
    ("answer", "SELECT region, COUNT(*) FROM survey WHERE smoker GROUP BY region ORDER BY 2 DESC"),
    ("answer", "SELECT region, COUNT(*) FILTER (WHERE smoker), AVG(CASE WHEN smoker THEN 1.0 ELSE 0.0 END) "
               "FROM survey GROUP BY region"),
    ("answer", "SELECT round(amount::numeric, -2) AS hundreds, COUNT(*) FROM visits GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT first_month, COUNT(*) FROM (SELECT person_id, MIN(date_trunc('month', day)) AS first_month "
               "FROM visits GROUP BY person_id) t GROUP BY 1 ORDER BY 1"),
    ("answer", "SELECT category, COUNT(*), AVG(n) FROM (SELECT person_id, category, COUNT(*) AS n FROM visits "
               "GROUP BY person_id, category) t GROUP BY category"),
    ("answer", "SELECT category, COUNT(*) FROM (SELECT DISTINCT person_id, category FROM visits) t GROUP BY 1"),
    ("answer", "SELECT category, COUNT(*) AS visits, COUNT(DISTINCT person_id) AS patients, SUM(amount) AS revenue "
               "FROM visits GROUP BY 1 ORDER BY revenue DESC"),
    ("answer", "SELECT EXTRACT(MONTH FROM day) AS m, SUM(n) FROM (SELECT day, COUNT(*) AS n FROM visits "
               "GROUP BY day) t GROUP BY 1 ORDER BY 1"),
    # found by the stop-60 batches: sets of people, sibling subqueries of one name, a standard deviation
    ("answer", "SELECT COUNT(*) FROM (SELECT person_id FROM visits WHERE EXTRACT(MONTH FROM day) = 1 INTERSECT "
               "SELECT person_id FROM visits WHERE EXTRACT(MONTH FROM day) = 12) t"),
    ("answer", "SELECT sex, COUNT(*) FROM people WHERE person_id IN (SELECT person_id FROM visits WHERE category = "
               "'lab' EXCEPT SELECT person_id FROM screenings) GROUP BY sex"),
    ("answer", "SELECT COUNT(*) FROM people p WHERE EXISTS (SELECT 1 FROM visits v WHERE v.person_id = p.person_id "
               "AND v.category = 'lab') AND NOT EXISTS (SELECT 1 FROM visits v WHERE v.person_id = p.person_id AND "
               "v.category = 'dental')"),
    ("answer", "SELECT category, COUNT(*), AVG(amount), stddev(amount) FROM visits GROUP BY 1 ORDER BY 2 DESC"),
    # added in stop 64: what Tableau, Looker and Metabase send, shares of a WITH query's total, math and text
    ("answer", 'SELECT "visits"."category" AS "category", CAST(TRUNC(EXTRACT(MONTH FROM "visits"."day")) AS '
               'INTEGER) AS "mn:day:ok", SUM("visits"."amount") AS "sum:amount:ok" FROM "public"."visits" "visits" '
               'GROUP BY 1, 2'),
    ("answer", "SELECT (DATE(visits.day)) AS visits_day_date, COUNT(*) AS visits_count FROM public.visits AS visits "
               "WHERE ((( visits.day ) >= ((SELECT (DATE_TRUNC('day', CURRENT_TIMESTAMP AT TIME ZONE 'UTC') + (-6 || "
               "' day')::INTERVAL))) AND ( visits.day ) < ((SELECT ((DATE_TRUNC('day', CURRENT_TIMESTAMP AT TIME "
               "ZONE 'UTC') + (-6 || ' day')::INTERVAL) + (7 || ' day')::INTERVAL))))) GROUP BY 1 ORDER BY 1 DESC "
               "LIMIT 500"),
    ("answer", "SELECT CAST(date_trunc('week', CAST((\"public\".\"visits\".\"day\" + INTERVAL '1 day') AS timestamp)) "
               "AS date) - INTERVAL '1 day' AS \"day\", count(*) AS \"count\" FROM \"public\".\"visits\" GROUP BY 1 "
               "ORDER BY 1 ASC"),
    ("answer", "WITH a AS (SELECT category, COUNT(*) AS n FROM visits GROUP BY 1), b AS (SELECT SUM(n) AS t FROM a) "
               "SELECT a.category, a.n * 100.0 / b.t FROM a, b"),
    ("answer", "WITH t AS (SELECT COUNT(*) AS total FROM visits) SELECT category, COUNT(*) * 1.0 / (SELECT total "
               "FROM t) FROM visits GROUP BY 1"),
    ("answer", "WITH monthly AS (SELECT date_trunc('month', day) AS m, SUM(amount) AS s FROM visits GROUP BY 1) "
               "SELECT AVG(s), MAX(s), MIN(s) FROM monthly"),
    ("answer", "SELECT exp(AVG(ln(amount + 1))) AS geo_mean, AVG(log(amount + 1)), SUM(power(amount, 0.5)) "
               "FROM visits"),
    ("answer", "SELECT sign(amount - 100) AS s, COUNT(*) FROM visits GROUP BY 1"),
    ("answer", "SELECT replace(category, 'a', 'A'), split_part(category, 'a', 1), COUNT(*) FROM visits "
               "GROUP BY 1, 2"),
    ("answer", "SELECT lpad(CAST(EXTRACT(MONTH FROM day) AS text), 2, '0') AS m, COUNT(*) FROM visits GROUP BY 1"),
    ("answer", "SELECT COUNT(*) FROM survey WHERE 'fever' = ANY(symptom)"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE category IN (SELECT category FROM visits GROUP BY category "
               "HAVING COUNT(*) > 500)"),
    ("answer", "SELECT COUNT(*) FROM visits WHERE amount::numeric(10,2) > 100.50"),
    # groups within a person: per visit, per (person, category), per person-day (prescriptions per visit was NULL)
    ("answer", "SELECT AVG(n) FROM (SELECT visit_id, COUNT(*) AS n FROM prescriptions GROUP BY visit_id) t"),
    ("answer", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY total) FROM (SELECT v.visit_id, "
               "SUM(p.cost) AS total FROM visits v JOIN prescriptions p ON p.visit_id = v.visit_id GROUP BY "
               "v.visit_id) t"),
    ("answer", "SELECT COUNT(*) FROM (SELECT DISTINCT person_id, category FROM visits) t"),
    ("answer", "SELECT AVG(n) FROM (SELECT person_id, day, COUNT(*) AS n FROM visits GROUP BY person_id, day) t"),
    ("answer", "SELECT COUNT(*) FROM people WHERE person_id NOT IN (SELECT person_id FROM visits)"),
    ("raw", "SELECT * FROM visits LIMIT 10"),
    ("raw", "SELECT person_id, income FROM people WHERE age > 90"),
    ("raw", "SELECT person_id FROM visits WHERE category = 'lab' INTERSECT SELECT person_id FROM screenings"),
    ("raw", "SELECT array_agg(category) FROM visits"),  # every row's value: stays refused (issue 37)
    ("bad", "SELECT COUNT(*) FROM people WHERE age > 'abc'"),
    ("bad", "SELECT COUNT(*) FROM visits WHERE day >= '2024-13-01'"),
]


def run(people: int) -> list[tuple[str, str, str, str]]:
    """Each statement with what was expected, what happened (answered, refused or failed) and the detail."""
    server = EmbeddedPostgres(tempfile.mkdtemp(prefix="dpsql-analyst-sql-"))
    url = server.start()
    try:
        load_demo_data(url, people=people, seed=7)
        conn = dpsql.connect(database=url, schema=str(SCHEMA), analyst=bench_analyst(url))
        outcomes = []
        for expected, sql in STATEMENTS:
            cursor = conn.cursor()
            try:
                cursor.execute(sql, epsilon=0.5)
                rows = cursor.fetchall()
                outcomes.append((expected, sql, "answered", f"{len(rows)} rows"))
            except dpsql.Error as exc:
                kind = "failed" if exc.sqlstate.startswith("22") else "refused"  # a data exception: a bad literal
                detail = f"{exc.code} (SQLSTATE {exc.sqlstate}): {exc}".replace("\n", " ")
                outcomes.append((expected, sql, kind, detail))
            print(f"{outcomes[-1][2]:>8}  {sql[:100]}", file=sys.stderr, flush=True)
        conn.close()
        return outcomes
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    outcomes = run(args.people)
    answers = [o for o in outcomes if o[0] == "answer"]
    answered = sum(o[2] == "answered" for o in answers)
    raw_refused = sum(o[2] == "refused" for o in outcomes if o[0] == "raw")
    bad_failed = sum(o[2] == "failed" for o in outcomes if o[0] == "bad")
    lines = [f"# What a new analyst meets ({datetime.date.today()})", "",
             f"`python benchmarks/analyst_sql.py --people {args.people}`: {answered} of {len(answers)} statements "
             f"that should be answered are answered; {raw_refused} of {sum(o[0] == 'raw' for o in outcomes)} that "
             f"ask for raw rows are refused; {bad_failed} of {sum(o[0] == 'bad' for o in outcomes)} with a bad "
             "literal fail with PostgreSQL's code.", "",
             "| expected | outcome | statement | detail |", "|---|---|---|---|"]
    for expected, sql, outcome, detail in outcomes:
        lines.append(f"| {expected} | {outcome} | `{sql}` | {detail.replace('|', '/')} |")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[:3]))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
