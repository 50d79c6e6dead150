import json,glob,collections,sys
comp=[]
for p in glob.glob(sys.argv[1]+"/*.json"):
    comp+=json.load(open(p))["compiles"]
miss=[c for c in comp if not c[2]]
small=[c for c in miss if c[3]<=0.3]
print(len(comp),"requests",len(miss),"compiled %.0f s"%sum(c[3] for c in miss),"small",len(small),"%.0f s"%sum(c[3] for c in small))
byf=collections.Counter(); byfn=collections.Counter(); byn=collections.Counter(); bynn=collections.Counter()
for t,n,h,c in small:
    f=t.split("::")[0]; byf[f]+=c; byfn[f]+=1; byn[n]+=c; bynn[n]+=1
for f,c in byf.most_common(25): print("%6.1f s %5d  %s"%(c,byfn[f],f))
print("---")
for n,c in byn.most_common(40): print("%6.1f s %5d  %s"%(c,bynn[n],n))
