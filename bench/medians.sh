# Sourced by the bench scripts that run modes in alternating rounds:
#   median            the median of the numbers on stdin (separated by spaces or lines)
#   against A B       A against B as a signed percentage ("-2.0%")
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
against() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%+.1f%%", (a / b - 1) * 100}'; }
